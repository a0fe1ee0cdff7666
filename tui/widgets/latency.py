"""The swarm's latency in a few lines, hidden until a token has a gap: the decoding agents' inter-token gaps,
the ended served requests' queue wait, prefill time and time to first token (each p50 / p95 / p99 over a
recent window, queue and inference apart), how their replies were read (the family, how many reasoned, calls
that did not parse), and a stall bound holding a prefill back (tui/latency.py)."""

from rich.text import Text
from textual.widgets import Static

from swarmtune.tui.stats import Stats


def seconds(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1000:.0f} ms" if x < 1 else f"{x:.1f} s"


def triple(p: tuple[float | None, float | None, float | None]) -> str:
    return " / ".join(seconds(x) for x in p)


def latency_text(stats: Stats) -> Text | None:
    """The panel's lines; None before a token has a gap or a request has ended."""
    lat = stats.latency
    if not lat.gaps_s and not lat.requests:
        return None
    t = Text("latency", style="bold")
    t.append(" p50 / p95 / p99, measured", style="dim")
    if lat.gaps_s:
        t.append(f"\n  inter-token {triple(lat.gap_percentiles())}")
        t.append(f"  (last {len(lat.gaps_s):,} tokens)", style="dim")
    if lat.requests:
        t.append(f"\n  queue {triple(lat.request_percentiles('queue_s'))}")
        t.append(f" │ prefill {triple(lat.request_percentiles('prefill_time_s'))}")
        t.append(f" │ TTFT {triple(lat.request_percentiles('ttft_s'))}")
        t.append(f"  (last {len(lat.requests):,} requests)", style="dim")
    if chats := [q for q in lat.requests if q.family]:
        families = sorted({q.family for q in chats})
        unparsed = sum(1 for q in chats if q.call_miss)
        t.append(f"\n  replies read as {', '.join(families)}: {sum(q.reasoned for q in chats)} of {len(chats)} "
                 "reasoned")
        t.append(f", {unparsed} with a call that did not parse" if unparsed else "",
                 style="yellow" if unparsed else "")
    if stall := lat.stall:
        t.append(f"\n  {stall} a step: the stall bound holds a prefill back", style="yellow")
    return t


class LatencyPanel(Static):
    _lines = -1

    def show(self, stats: Stats) -> None:
        t = latency_text(stats)
        if t is None:
            self.display = False
            return
        lines = t.plain.count("\n")
        reflow = not self.display or lines != self._lines  # its height changes only with its lines
        self._lines, self.display = lines, True
        self.update(t, layout=reflow)

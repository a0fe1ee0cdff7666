from rich.text import Text
from textual.widgets import Static

from swarmtune.tui.stats import Stats


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000:
            return f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} PB"


class StatusLine(Static):
    def show(self, stats: Stats, mode: str, paused: bool, extra: str = "") -> None:
        self.update(status_text(stats, mode, paused, extra), layout=False)  # one line, always: no reflow


def status_text(stats: Stats, mode: str, paused: bool, extra: str = "") -> Text:
    """The numbers first, so an 80-column terminal still shows them; the model and device last."""
    h, r = stats.header, stats.latest
    t = Text()
    if mode:
        t.append(f" {mode} ", style="bold reverse red")
        t.append(" ")
    if paused:
        t.append("PAUSED ", style="bold yellow")
    src = h.get("source", "")
    device = (h.get("settings") or {}).get("device") or {}
    if isinstance(device, dict) and device.get("emulated"):
        src += ", CPU-emulated device"  # a software device's figures are never a GPU's
    t.append(f"{stats.tokens_per_second:,.1f} tok/s", style="bold")
    t.append(f" ({src}) {stats.steps_per_second:,.1f} steps/s")
    if r is not None:
        t.append(f" | KV {r.kv_type} | cap {r.batch_cap} | {len(r.agents)} agents")
        if stats.tuner_on:
            t.append(" | tuner on", style="bold magenta")
            if stats.tuner_trying:
                t.append(f", trying {stats.tuner_trying}", style="magenta")
            if stats.tuner_budget:
                t.append(f"; {stats.tuner_budget}", style="magenta")
            if stats.tuner_drafts:
                t.append(f"; {stats.tuner_drafts}", style="magenta")
        if stats.tuner_spent_s is not None and stats.tuner_spent_at_s > 0:
            share = stats.tuner_spent_s / stats.tuner_spent_at_s
            t.append(f" | tuner spent {stats.tuner_spent_s:.1f} s ({share:.1%})")
    if stats.drafted:
        gain = stats.draft_gain
        t.append(f" | drafts kept {stats.accepted:,}/{stats.drafted:,} ({stats.accepted / stats.drafted:.0%})"
                 + (f", +{gain:.2f} tok/agent-step" if gain is not None else ""), style="green")
    if stats.quality and r is not None:
        t.append(f" | quality vs f16 (measured): {stats.quality_text(r.kv_type)}", style="cyan")
    if extra:
        t.append(f" | {extra}", style="italic")
    model = h.get("model", {}).get("name", "?")
    t.append(f" | {model} | {h.get('backend', '?')} on {h.get('device', '?')}")
    return t

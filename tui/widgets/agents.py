"""One row per agent: state, context against its limit, tokens generated, its rate, its joules per token
(its share of each step's energy, engine/measure/energy_share.py), the tail of its text (a served agent's: its
request's queue wait, time to first token and inter-token gap, its conversation's key and the prompt tokens it
reused first; where it drafts, the share of its drafts it kept).

Fixed-width lines of rich Text, not a Table or a DataTable: the rows are rebuilt whole at each repaint,
and measuring a Table's cells took 3.7 ms a frame against 0.85 ms for these lines (a DataTable's per-cell
updates cost more still), time taken from the engine's threads on a small CPU. Drawn through the line API
(tui/widgets/lines.py) for the same reason."""

from rich.text import Text
from textual.geometry import Size

from swarmtune.engine.record.records import AgentView
from swarmtune.tui.stats import Stats
from swarmtune.tui.widgets.lines import TextLines

STATE_STYLE = {"decoding": "green", "waiting": "yellow", "prefilling": "cyan", "preempted": "red", "idle": "dim",
               "tool": "blue", "client": "blue"}
# where a waiting agent's history is, after its state: in the cache (nothing shown), host memory, nowhere
RESIDENCY_MARK = {"cache": "", "host": " ↓host", "none": " ↓drop"}
BAR = 8
# column widths; the text tail takes what is left of the line
ID_W, STATE_W, CONTEXT_W, GEN_W, RATE_W, JOULES_W = 2, 10, 20, 6, 6, 6
FIXED_W = ID_W + STATE_W + CONTEXT_W + GEN_W + RATE_W + JOULES_W + 6  # and a space after each column


def tokens(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 10_000 else f"{n:,}"


def joules(j: float | None) -> str:
    """Joules per token: three significant figures, "-" where no energy figure exists."""
    if j is None:
        return "-"
    return f"{j:.3g}" if j < 1000 else f"{j:.0f}"


def context_bar(context: int, limit: int) -> Text:
    frac = min(1.0, context / limit) if limit else 0.0
    full = round(frac * BAR)
    return Text("█" * full + "░" * (BAR - full), style="magenta") + Text(f" {tokens(context)}/{tokens(limit)}")


def cell(text: str | Text, width: int, right: bool = False) -> Text:
    t = text if isinstance(text, Text) else Text(text)
    t.truncate(width, pad=not right)
    if right and len(t) < width:
        t = Text(" " * (width - len(t))) + t
    return t


def acceptance(a: AgentView) -> Text:
    """Where it drafts (--draft): the share of its drafted tokens it kept, before its text."""
    return Text(f"✓{a.accepted / a.drafted:.0%} ", style="dim") if a.drafted else Text("")


def served_label(label: str, reused: int | None) -> Text:
    """A served agent's conversation, and how much of its last prompt was reused, before its text."""
    if not label:
        return Text("")
    return Text(f"{label[:16]}" + (f" ♻{tokens(reused)}" if reused else "") + " │ ", style="dim")


def progress(a: AgentView, rate: float | None) -> Text:
    """A prompt (or tool result) being prefilled: tokens in the cache of the whole, and the time left at the
    recent prefill rate; nothing once it is in."""
    if not a.pending or a.state != "prefilling":
        return Text("")
    left = f" ~{a.pending / rate:,.0f} s" if rate else ""
    return Text(f"⏳{a.context:,}/{a.context + a.pending:,}{left} │ ", style="cyan")


def waited(a: AgentView, itl_s: float | None) -> Text:
    """A served agent's request: its wait in the queue, its time to first token once one came, and the mean
    gap between its last tokens (measured, on the engine's clock)."""
    if a.queue_s is None:
        return Text("")
    parts = [f"q {secs(a.queue_s)}"]
    if a.ttft_s is not None:
        parts.append(f"ttft {secs(a.ttft_s)}")
        if itl_s is not None and a.state in ("decoding", "waiting"):
            parts.append(f"itl {secs(itl_s)}")
    return Text(" ".join(parts) + " │ ", style="dim")


def secs(x: float) -> str:
    return f"{x * 1000:.0f}ms" if x < 1 else f"{x:.1f}s"


class AgentsTable(TextLines):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._agents: list[AgentView] = []
        self._rates: dict[int, float] = {}
        self._joules: dict[int, float | None] = {}
        self._prefill_rate: float | None = None
        self._itl: dict[int, float | None] = {}

    def show(self, stats: Stats) -> None:
        r = stats.latest
        if r is None:
            return
        reflow = len(r.agents) != len(self._agents)  # its height changes only when agents come or go
        self._agents = list(r.agents)
        self._rates = {a.id: stats.agent_tokens_per_second(a.id) for a in r.agents}
        self._joules = {a.id: stats.agent_joules_per_token(a.id, a.generated) for a in r.agents}
        self._prefill_rate = stats.prefill_tokens_per_s
        self._itl = {a.id: stats.latency.agent_itl_s(a.id) for a in r.agents if a.queue_s is not None}
        if reflow:
            self.refresh(layout=True)
        self.redraw()

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._agents) + 1  # the header and a row per agent

    def text(self, width: int, height: int) -> Text:
        tail_w = max(0, width - FIXED_W)
        lines = [Text.assemble(cell("id", ID_W, True), " ", cell("state", STATE_W), " ", cell("context", CONTEXT_W),
                               " ", cell("gen", GEN_W, True), " ", cell("tok/s", RATE_W, True), " ",
                               cell("J/tok", JOULES_W, True), " ", cell("text", tail_w), style="bold")]
        for a in self._agents:
            state = Text(a.state + RESIDENCY_MARK.get(a.residency, ""), style=STATE_STYLE.get(a.state, ""))
            lines.append(Text.assemble(
                cell(str(a.id), ID_W, True), " ", cell(state, STATE_W),
                " ", cell(context_bar(a.context, a.limit), CONTEXT_W), " ", cell(f"{a.generated:,}", GEN_W, True),
                " ", cell(f"{self._rates[a.id]:.1f}", RATE_W, True),
                " ", cell(joules(self._joules[a.id]), JOULES_W, True),
                " ", cell(progress(a, self._prefill_rate) + waited(a, self._itl.get(a.id)) + acceptance(a)
                          + served_label(a.label, a.reused)
                          + a.tail.replace("\n", " ")[-40:], tail_w),
            ))
        return Text("\n").join(lines)

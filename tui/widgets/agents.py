"""One row per agent: state, context against its limit, tokens generated, its rate, the tail of its text.

A rich Table in a Static, not a DataTable: the rows are rebuilt whole at each repaint, and a
DataTable's per-cell updates cost several times more to render (time taken from the engine's thread
on a small CPU)."""

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from swarmtune.tui.stats import Stats

STATE_STYLE = {"decoding": "green", "waiting": "yellow", "prefilling": "cyan", "preempted": "red", "idle": "dim"}
BAR = 8


def tokens(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 10_000 else f"{n:,}"


def context_bar(context: int, limit: int) -> Text:
    frac = min(1.0, context / limit) if limit else 0.0
    full = round(frac * BAR)
    return Text("█" * full + "░" * (BAR - full), style="magenta") + Text(f" {tokens(context)}/{tokens(limit)}")


class AgentsTable(Static):
    _rows = -1

    def show(self, stats: Stats) -> None:
        r = stats.latest
        if r is None:
            return
        t = Table(expand=True, box=None, padding=(0, 1), collapse_padding=True, pad_edge=False, header_style="bold",
                  show_edge=False)
        t.add_column("id", justify="right", width=2, no_wrap=True)
        t.add_column("state", width=10, no_wrap=True)
        t.add_column("context", no_wrap=True, min_width=20)
        t.add_column("gen", justify="right", no_wrap=True, min_width=5)
        t.add_column("tok/s", justify="right", no_wrap=True, min_width=5)
        t.add_column("text", no_wrap=True, overflow="crop", ratio=1)
        for a in r.agents:
            t.add_row(
                str(a.id), Text(a.state, style=STATE_STYLE.get(a.state, "")), context_bar(a.context, a.limit),
                f"{a.generated:,}", f"{stats.agent_tokens_per_second(a.id):.1f}", a.tail.replace("\n", " ")[-40:],
            )
        # its height changes only when agents come or go: reflow the screen only then
        self.update(t, layout=len(r.agents) != self._rows)
        self._rows = len(r.agents)

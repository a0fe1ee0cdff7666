from rich.text import Text
from textual.widgets import DataTable

from tui.stats import Stats

STATE_STYLE = {"decoding": "green", "waiting": "yellow", "prefilling": "cyan", "preempted": "red"}
BAR = 12


def context_bar(context: int, limit: int) -> Text:
    frac = min(1.0, context / limit) if limit else 0.0
    full = round(frac * BAR)
    return Text("█" * full + "░" * (BAR - full), style="magenta") + Text(f" {context:>6,}/{limit:,}")


class AgentsTable(DataTable):
    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        for col in ("id", "state", "context", "gen", "tok/s", "text"):
            self.add_column(col, key=col)

    def show(self, stats: Stats) -> None:
        r = stats.latest
        if r is None:
            return
        rows = {str(a.id) for a in r.agents}
        for key in list(self.rows):
            if key.value not in rows:
                self.remove_row(key)
        for a in r.agents:
            cells = [
                str(a.id),
                Text(a.state, style=STATE_STYLE.get(a.state, "")),
                context_bar(a.context, a.limit),
                f"{a.generated:,}",
                f"{stats.agent_tokens_per_second(a.id):.1f}",
                a.tail.replace("\n", " ")[-40:],
            ]
            key = str(a.id)
            if key in self.rows:
                for col, value in zip(("id", "state", "context", "gen", "tok/s", "text"), cells, strict=True):
                    self.update_cell(key, col, value)
            else:
                self.add_row(*cells, key=key)

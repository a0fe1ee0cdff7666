"""The latest served turns that prefilled what their conversation had held, and why (engine/conversation/cache_miss.py),
or whose call did not parse, and why (engine/conversation/formats/): hidden until the first one, so a
synthetic swarm's screen is as it was."""

from rich.text import Text
from textual.widgets import Static

from swarmtune.tui.stats import Stats


class MissesPanel(Static):
    def show(self, stats: Stats) -> None:
        if not stats.misses:
            self.display = False
            return
        t = Text("turns that missed their cache or a call (newest last)", style="bold")
        for _, aid, label, miss in stats.misses:
            t.append(f"\nagent {aid}" + (f" {label[:20]}" if label else "") + ": ", style="dim")
            t.append(miss)
        reflow = not self.display
        self.display = True
        self.update(t, layout=reflow)

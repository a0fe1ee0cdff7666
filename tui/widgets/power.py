from rich.text import Text
from textual.widgets import Static

from swarmtune.tui.stats import Stats


class PowerPanel(Static):
    def show(self, stats: Stats) -> None:
        r = stats.latest_decode
        h = stats.header
        detail = h.get("power", {}).get("detail", "") if h else ""
        t = Text()
        t.append("power  ", style="bold")
        if r is None or r.watts is None:
            t.append(detail or "n/a")
            self.update(t, layout=False)
            return
        t.append(f"{r.watts:,.1f} W ({r.power_source})")
        jpt = stats.joules_per_token
        if jpt:
            t.append(f" | {jpt:.3f} J/token, {1 / jpt:.2f} tokens/J (rolling)")
        if r.next_agent_joules_per_token is not None and r.modeled_joules_per_token is not None:
            lowers = r.next_agent_joules_per_token < r.modeled_joules_per_token
            t.append(" | one more agent: ")
            t.append(f"{r.modeled_joules_per_token:.3f} -> {r.next_agent_joules_per_token:.3f} J/token (modeled), ")
            t.append("still lowers J/token" if lowers else "no longer pays", style="green" if lowers else "red")
        self.update(t, layout=False)  # its height is fixed in app.tcss: no need to reflow the screen

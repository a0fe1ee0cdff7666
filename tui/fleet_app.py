"""The fleet dashboard: every swarmtune node a Prometheus server scrapes, one row each, the fleet's totals,
and controls sent to one node or to all of them through each node's own `/v1/control`.

Prometheus is read in a worker thread every `interval_s`; a read that fails keeps the last rows on screen
and says so in the header, rather than blanking the fleet."""

import time
from collections.abc import Mapping

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Footer, Input, Static

from swarmtune.engine.control import COMMAND_HELP, Control, parse_command
from swarmtune.engine.errors import UserError
from swarmtune.sources.fleet import FleetSnapshot, NodeFigures, PrometheusFleet
from swarmtune.sources.fleet_control import NodeAnswer, send_control

COLUMNS = ("node", "state", "kv", "cap", "agents", "ctx", "KV used", "tok/s", "hit", "W", "J/tok", "tuner",
           "run/wait", "last control")
ALL = "fleet"  # the totals row's key: a command with the cursor there goes to every node
FLEET_HELP = (f": a command to the node under the cursor (on the fleet row: to every node); 'all ' before it: "
              f"every node. Commands: {COMMAND_HELP} | q quit")


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def node_cells(n: NodeFigures, answer: NodeAnswer | None) -> tuple[str, ...]:
    if n.up:
        state = "[green]up[/]"
    else:
        state = "[b red]DOWN[/]" + (f" {n.down_s:.0f}s" if n.down_s is not None else "")
    tuner = "-" if n.tuner_on is None else ("on" if n.tuner_on else "off")
    reqs = "-" if n.running is None else f"{n.running}/{n.waiting or 0}"
    last = "" if answer is None else (f"[green]ok[/] {answer.line}" if answer.ok else f"[red]{answer.line}[/]")
    return (n.instance, state, n.kv or "?", _f(n.batch_cap, "d"), _f(n.agents, "d"), _f(n.mean_context_tokens, ".0f"),
            _f(None if n.kv_usage is None else 100 * n.kv_usage, ".0f") + ("%" if n.kv_usage is not None else ""),
            _f(n.tokens_per_second, ".1f"), _f(None if n.hit_rate is None else 100 * n.hit_rate, ".0f")
            + ("%" if n.hit_rate is not None else ""), _f(n.watts, ".0f"), _f(n.joules_per_token, ".3f"), tuner,
            reqs, last)


def header_line(url: str, snap: FleetSnapshot | None, error: str | None) -> str:
    if snap is None:
        return f"fleet via {url}: " + (f"[red]{error}[/]" if error else "reading Prometheus...")
    t = snap.totals
    power = ("" if t.watts is None else f" | {t.watts:.0f} W, {_f(t.joules_per_token, '.3f')} J/tok over "
             f"{t.powered} of {t.nodes_up} nodes")
    hit = "-" if t.hit_rate is None else f"{100 * t.hit_rate:.0f}%"
    line = (f"fleet via {url} | {t.nodes_up}/{t.nodes} nodes up | {t.agents} agents | "
            f"{t.tokens_per_second:.1f} tok/s | cache hit {hit}{power}")
    if error:
        line += f" | [red]{error} (rows from {time.time() - snap.taken_at_s:.0f}s ago)[/]"
    return line


class FleetApp(App):
    TITLE = "swarmtune fleet"
    CSS = """
    #header { height: auto; background: $boost; padding: 0 1; }
    #nodes { height: 1fr; }
    #command { display: none; }
    """
    BINDINGS = [Binding("colon", "command", "command", key_display=":"), Binding("question_mark", "help", "help"),
                Binding("q", "quit", "quit")]

    def __init__(self, fleet: PrometheusFleet, interval_s: float, tokens: Mapping[str, str],
                 default_token: str | None) -> None:
        super().__init__()
        self.fleet, self.interval_s = fleet, interval_s
        self.tokens, self.default_token = tokens, default_token
        self.snapshot: FleetSnapshot | None = None
        self.error: str | None = None
        self.answers: dict[str, NodeAnswer] = {}  # each node's answer to the last control sent to it

    def compose(self) -> ComposeResult:
        yield Static(header_line(self.fleet.url, None, None), id="header")
        table: DataTable = DataTable(id="nodes", cursor_type="row", zebra_stripes=True)
        table.add_columns(*COLUMNS)
        yield table
        yield Input(placeholder="kv q8_0 | cap 4 | agents 6 | autotune on  ('all ' first: every node)", id="command")
        yield Footer()

    def on_mount(self) -> None:
        self.read_fleet()
        self.set_interval(self.interval_s, self.read_fleet)
        self.query_one("#nodes").focus()

    @work(thread=True, exclusive=True, group="read")
    def read_fleet(self) -> None:
        try:
            snap, error = self.fleet.read(), None
        except UserError as e:
            snap, error = None, str(e)
        self.call_from_thread(self.show, snap, error)

    def show(self, snap: FleetSnapshot | None, error: str | None) -> None:
        self.error = error
        if snap is not None:
            self.snapshot = snap
        self.query_one("#header", Static).update(header_line(self.fleet.url, self.snapshot, error))
        if snap is None:
            return
        table = self.query_one("#nodes", DataTable)
        at = table.cursor_row
        table.clear()
        for n in snap.nodes:
            table.add_row(*node_cells(n, self.answers.get(n.instance)), key=n.instance)
        t = snap.totals
        table.add_row(f"[b]{ALL}[/]", f"{t.nodes_up}/{t.nodes} up", "", "", str(t.agents), "", "",
                      f"{t.tokens_per_second:.1f}", _f(None if t.hit_rate is None else 100 * t.hit_rate, ".0f")
                      + ("%" if t.hit_rate is not None else ""), _f(t.watts, ".0f"), _f(t.joules_per_token, ".3f"),
                      "", "", "", key=ALL)
        table.move_cursor(row=min(at, table.row_count - 1))

    def target(self) -> list[str]:
        """The nodes a command goes to: the one under the cursor, or all of them on the fleet row."""
        nodes = [n.instance for n in self.snapshot.nodes] if self.snapshot else []
        table = self.query_one("#nodes", DataTable)
        if not nodes or table.row_count == 0:
            return []
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return nodes if key == ALL else [key] if key in nodes else []

    def action_help(self) -> None:
        self.notify(FLEET_HELP, title="keys", timeout=10)

    def action_command(self) -> None:
        box = self.query_one("#command", Input)
        box.display = True
        box.focus()

    @on(Input.Submitted, "#command")
    def run_command(self, event: Input.Submitted) -> None:
        box = self.query_one("#command", Input)
        box.display, box.value = False, ""
        self.query_one("#nodes").focus()
        text = event.value.strip()
        every = text.startswith("all ")
        try:
            change = parse_command(text.removeprefix("all ") if every else text)
        except UserError as e:
            self.notify(str(e), severity="error")
            return
        nodes = [n.instance for n in self.snapshot.nodes] if every and self.snapshot else self.target()
        if not nodes:
            self.notify("no node to send it to: Prometheus knows none yet", severity="error")
            return
        self.send(change, nodes)

    @work(thread=True, group="control")
    def send(self, change: Control, nodes: list[str]) -> None:
        answers = send_control(change, nodes, self.tokens, self.default_token)
        self.call_from_thread(self.answered, answers)

    def answered(self, answers: list[NodeAnswer]) -> None:
        self.answers.update({a.instance: a for a in answers})
        refused = [a for a in answers if not a.ok]
        if refused:
            self.notify("; ".join(f"{a.instance}: {a.line}" for a in refused), severity="error", timeout=8)
        else:
            self.notify(f"applied on {len(answers)} node{'s' if len(answers) > 1 else ''}", timeout=3)
        if self.snapshot is not None:
            self.show(self.snapshot, self.error)  # the answers' column at once, not at the next read

    def key_escape(self) -> None:
        box = self.query_one("#command", Input)
        if box.display:
            box.display, box.value = False, ""
            self.query_one("#nodes").focus()

    def on_unmount(self) -> None:
        self.workers.cancel_all()


def run_fleet(fleet: PrometheusFleet, interval_s: float, tokens: Mapping[str, str], default_token: str | None) -> int:
    try:
        FleetApp(fleet, interval_s, tokens, default_token).run()
    finally:
        fleet.close()
    return 0

"""The dashboard: one screen of panels fed by a source (a live engine, a recording, a remote engine).
The source runs in a worker thread; the UI repaints at most ~10 times a second."""

import sys
import threading
import time

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.css.query import NoMatches
from textual.timer import Timer
from textual.widgets import Footer, Input, ProgressBar

from swarmtune.engine.control import Control, parse_command
from swarmtune.engine.errors import UserError
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.record.records import StepRecord
from swarmtune.engine.settings import DraftSetting
from swarmtune.sources.protocol import Sink, Source
from swarmtune.tui.kv_picker import KVPicker
from swarmtune.tui.messages import EngineFailed, EngineProgress, Seeked, StepsArrived
from swarmtune.tui.stats import Stats
from swarmtune.tui.widgets.agents import AgentsTable
from swarmtune.tui.widgets.latency import LatencyPanel
from swarmtune.tui.widgets.misses import MissesPanel
from swarmtune.tui.widgets.plots import BatchPlot, BytesPlot, SpeedupPlot
from swarmtune.tui.widgets.power import PowerPanel
from swarmtune.tui.widgets.status import StatusLine

KV_CYCLE = tuple(KVSetting.parse(t) for t in ("f16", "q8_0", "q4_0"))
DRAFT_CYCLE = ("0", "4", "8", "auto")  # the d key's speculation settings, in turn
UI_INTERVAL_S = 0.25  # at most 4 batches of records a second reach the UI
EAGER_S = 1.0  # after a control, records reach the UI one by one for this long: its effect shows at once
# How often each panel repaints at most: numbers and the live batch once a second (as nvtop does), the
# slower curves every 2 s. A panel is due when the clock enters a new one of its intervals, and the
# intervals are multiples of each other, so panels due together repaint in one compositor frame. On a
# small CPU the UI thread's time is taken from the engine's decode (bench/dashboard_overhead.py: at twice
# a second the UI thread took 3% of a core and the decode 3-7% on a 2-core EPYC); a key's effect and a
# new setting repaint the status line at once whatever its interval.
PANEL_INTERVAL_S: dict[type, float] = {StatusLine: 1.0, AgentsTable: 1.0, LatencyPanel: 1.0, MissesPanel: 1.0,
                                       PowerPanel: 1.0, BatchPlot: 1.0, BytesPlot: 2.0, SpeedupPlot: 2.0}
LIVE_HELP = (
    "k cycle KV (f16 -> q8_0 -> q4_0) | K pick a KV type | : type a command (kv TYPE or K/V, cap N, agents N, "
    "residency keep|swap|drop, autotune on|off, draft N|auto) | +/- batch cap | a/x add/remove agent | "
    "t tuner on/off | d drafts (0 -> 4 -> 8 -> auto) | space pause | r reset statistics | q quit"
)
REPLAY_HELP = (
    "space pause | . one step | [ ] seek 10% back/forward | < > half/double speed | r reset statistics | q quit"
)


def void(_: object) -> None:
    """A sink's callbacks return nothing; Textual's post_message says whether it queued the message."""



class SwarmApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "swarmtune"
    BINDINGS = [
        Binding("k", "cycle_kv", "KV type"),
        Binding("K", "pick_kv", "pick KV", show=False),
        Binding("plus,equals_sign", "cap(1)", "cap +", key_display="+"),
        Binding("minus", "cap(-1)", "cap -", key_display="-"),
        Binding("a", "agents(1)", "add agent"),
        Binding("t", "autotune", "autotune"),
        Binding("d", "cycle_draft", "drafts", show=False),
        Binding("x", "agents(-1)", "remove agent"),
        Binding("space", "pause", "pause"),
        Binding("full_stop", "step_once", "step", key_display="."),
        Binding("left_square_bracket", "seek(-1)", "seek -", key_display="["),
        Binding("right_square_bracket", "seek(1)", "seek +", key_display="]"),
        Binding("less_than_sign", "speed(0.5)", "slower", key_display="<"),
        Binding("greater_than_sign", "speed(2)", "faster", key_display=">"),
        Binding("r", "reset", "reset stats"),
        Binding("colon", "command", "command", key_display=":"),
        Binding("question_mark", "help", "help", key_display="?"),
        Binding("q", "quit", "quit"),
    ]

    def __init__(self, source: Source, animate: bool = True) -> None:
        super().__init__()
        self.source = source
        self.stats = Stats()
        self.mode = source.mode
        self._dirty = False
        self._animated = animate  # snapshot tests freeze the source
        self.engine_stopped = threading.Event()  # set once the worker has left the source for good
        self._panel_errors: set[type] = set()
        self._switch_interval_s = sys.getswitchinterval()
        self._painted: dict[type, float] = {}
        self._painted_tick: dict[type, int] = {}  # the interval (now // its length) each panel last painted in
        self._force_status = True  # a pause, a seek or a status change shows at once
        self._shown_setting: tuple | None = None  # (KV, cap, agents) of the record the status line last showed
        self._sink: Sink | None = None
        self._eager: Timer | None = None  # ends the one-by-one records after a control

    # kept for the tests and the benchmarks, which drive a live engine
    @property
    def engine(self):
        return getattr(self.source, "engine", None)

    @property
    def paused(self) -> bool:
        return self.source.paused

    def compose(self) -> ComposeResult:
        yield StatusLine(id="status")
        # determinate from the start: an indeterminate bar animates at 15 Hz even while hidden, and every
        # frame is a screen update taken from the engine on a small CPU
        yield ProgressBar(id="rebuild", total=1, show_eta=False)
        with Horizontal(id="top"):
            with VerticalScroll(id="agents-box"):
                yield AgentsTable(id="agents")
                yield LatencyPanel(id="latency")
                yield MissesPanel(id="misses")
            with Vertical(id="right"):
                yield BatchPlot(id="batch")
                yield PowerPanel(id="power")
        with Horizontal(id="bottom"):
            yield SpeedupPlot(id="speedup")
            yield BytesPlot(id="bytes")
        yield Input(placeholder="kv q8_0 | cap 4 | agents 6  (enter to apply, escape to close)", id="command")
        yield Footer()

    def on_mount(self) -> None:
        # The engine thread gives up the GIL at every llama.cpp call and must win it back from the UI;
        # a shorter switch interval (default 5 ms) gets it back sooner.
        self._switch_interval_s = sys.getswitchinterval()
        sys.setswitchinterval(0.0002)
        self.query_one("#command").display = False
        self.query_one("#agents-box").focus()  # not the hidden command box, which would swallow the keys
        self._main(StatusLine).update("starting...")
        if self._animated:
            self.run_source()
        else:
            self.engine_stopped.set()
        self.set_interval(UI_INTERVAL_S, self.refresh_panels)

    # the source, off the UI thread
    @work(thread=True, exclusive=True, name="source")
    def run_source(self) -> None:
        from textual.worker import get_current_worker

        worker = get_current_worker()
        sink = Sink(
            records=lambda recs: void(self.post_message(StepsArrived(recs))),
            header=lambda h: self.call_from_thread(self._set_header, h),
            progress=self._engine_progress,
            seeked=lambda before: void(self.post_message(Seeked(before))),
            notice=lambda line: void(self.call_from_thread(self.notify, line, severity="error", timeout=10)),
            every_s=UI_INTERVAL_S,
        )
        self._sink = sink
        try:
            self.source.run(sink, cancelled=lambda: worker.is_cancelled)
        except Exception as e:  # shown on screen, never a traceback; the engine's own refusals in its words
            self.post_message(EngineFailed(str(e) if isinstance(e, UserError) else f"{type(e).__name__}: {e}"))
        finally:
            self.engine_stopped.set()

    def _engine_progress(self, what: str, done: int, total: int) -> None:
        self.post_message(EngineProgress(what, done, total))

    # The UI thread keeps its priority. Lowered to the lowest (nice 19) while llama.cpp's threads decode on
    # every core, it got almost no CPU: 7.8 s to the first full screen and 8 s for a key here
    # (bench/first_screen.py), where at its own priority they took 1.07 s and 7 ms; and a thread lowered
    # so cannot be raised back without privileges.

    def stop_engine(self, timeout_s: float = 30.0) -> bool:
        """Cancel the worker and wait until it is out of the source: freeing a llama.cpp context under a
        running decode crashes the process."""
        self.workers.cancel_all()
        self.source.stop()
        return self.engine_stopped.wait(timeout_s)

    CONTROL_ACTIONS = {"cycle_kv", "pick_kv", "cap", "agents", "command", "autotune", "cycle_draft"}
    REPLAY_ACTIONS = {"step_once", "seek", "speed"}

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        """The footer fits the source: a replay shows its own keys instead of the engine's controls; an
        attached read-only engine shows the controls disabled (dimmed)."""
        caps = self.source.capabilities
        if action in self.REPLAY_ACTIONS:
            return caps.seek
        if action in self.CONTROL_ACTIONS:
            if caps.seek:
                return False
            if not caps.controls:
                return None
        return True

    def _set_header(self, header: dict) -> None:
        self.stats.set_header(header)
        self._dirty = True
        if self.stats.steps == 0:  # before the first step: every panel draws now, from the header
            self._painted_tick.clear()
            self._force_status = True
            self.refresh_panels()

    def on_seeked(self, message: Seeked) -> None:
        self.stats.reset()
        for r in message.before:
            self.stats.add(r)
        self._dirty = True
        self._painted_tick.clear()  # after a seek every panel repaints at once

    def feed(self, header: dict, records: list[StepRecord]) -> None:
        """Show records directly (snapshot tests, frozen replays)."""
        self.stats.header = header
        for r in records:
            self.stats.add(r)
        self._dirty = True
        self._painted_tick.clear()
        self.refresh_panels()

    def on_steps_arrived(self, message: StepsArrived) -> None:
        for r in message.records:
            self.stats.add(r)
            if r.kind == "tune":  # every decision of the tuner, and its outcome, is a line on screen
                self.notify(r.note, title="tuner", timeout=12)
        self._dirty = True
        last = self.stats.latest
        if last is not None and (last.kv_type, last.batch_cap, len(last.agents)) != self._shown_setting:
            # a setting the engine now runs at (a key's, the tuner's) shows now, not at the status's next tick
            self._force_status = True
            self.refresh_panels()

    def on_engine_progress(self, message: EngineProgress) -> None:
        if not self.screen_stack:
            return
        try:
            bar = self._main(ProgressBar)
        except NoMatches:
            return
        bar.set_class(message.done < message.total, "active")
        bar.update(total=message.total, progress=message.done)
        self._main(StatusLine).update(f"{message.what}: {message.done}/{message.total}")

    def on_engine_failed(self, message: EngineFailed) -> None:
        self.notify(message.error, severity="error", timeout=30)

    def painted_at(self, panel: type) -> float:
        """When a panel last painted (time.monotonic()); 0 before its first paint."""
        return self._painted.get(panel, 0.0)

    def _main(self, widget_type):
        """A panel of the main screen, whichever screen (the KV picker) is on top."""
        return self.screen_stack[0].query_one(widget_type)

    def _due(self, panel: type, now: float) -> bool:
        """Whether a panel repaints now (and if so, noted as painted): once per interval of its length."""
        tick = int(now // PANEL_INTERVAL_S.get(panel, UI_INTERVAL_S))
        if self._painted_tick.get(panel) == tick:
            return False
        self._painted_tick[panel] = tick
        self._painted[panel] = now
        return True

    def refresh_panels(self) -> None:
        if not self._dirty or not self.screen_stack:
            return
        try:
            self._main(StatusLine)
        except NoMatches:  # the app is shutting down
            return
        self._dirty = False
        s = self.stats
        extra = self.source.status or s.rebuild_note
        now = time.monotonic()
        if self._due(StatusLine, now) or self._force_status:
            self._painted[StatusLine] = now
            self._force_status = False
            s.tuner_on = bool(self.source.state().autotune)
            self._main(StatusLine).show(s, self.mode, self.source.paused, extra)
            if s.latest is not None:
                self._shown_setting = (s.latest.kv_type, s.latest.batch_cap, len(s.latest.agents))
        for panel in (AgentsTable, LatencyPanel, MissesPanel, BatchPlot, SpeedupPlot, BytesPlot, PowerPanel):
            # Plots cost the most to render; on a small CPU that time is taken from the engine's thread
            # (each ctypes call must win the GIL back), so they repaint less often than the numbers.
            if not self._due(panel, now):
                self._dirty = True  # come back for it
                continue
            try:
                self._main(panel).show(s)
            except Exception as e:  # one panel that cannot draw must not take the dashboard down
                if panel not in self._panel_errors:
                    self._panel_errors.add(panel)
                    self.notify(f"{panel.__name__}: {type(e).__name__}: {e}", severity="error", timeout=15)

    # controls: validated by the source; a refusal is a message, the engine unaffected
    def _control(self, c: Control) -> None:
        try:
            st = self.source.request(c)
        except UserError as e:
            self.notify(str(e), severity="error")
            return
        tuner = "" if st.autotune is None else f", tuner {'on' if st.autotune else 'off'}"
        draft = "" if st.draft is None else f", drafts {st.draft.label}"
        self.notify(f"KV {st.kv_label}, batch cap {st.batch_cap}, agents {st.agents}, residency {st.residency}{tuner}"
                    f"{draft}", timeout=3)
        # the setting shows at once, not at the next paint: a key's effect is what the user waits for
        self._dirty = self._force_status = True
        self.refresh_panels()
        if self._sink is not None:  # and the record that applies it comes at once, not in the next batch
            self._sink.every_s = 0.0
            if self._eager is not None:  # a second control within the window: the window starts again
                self._eager.stop()
            self._eager = self.set_timer(EAGER_S, self._batch_again)

    def _batch_again(self) -> None:
        if self._sink is not None:
            self._sink.every_s = UI_INTERVAL_S

    def action_cycle_kv(self) -> None:
        cur = self.source.state().kv
        nxt = KV_CYCLE[(KV_CYCLE.index(cur) + 1) % len(KV_CYCLE)] if cur in KV_CYCLE else KV_CYCLE[0]
        self._control(Control(kv=nxt))

    def action_pick_kv(self) -> None:
        def picked(kv: KVSetting | None) -> None:
            if kv is not None and kv != self.source.state().kv:
                self._control(Control(kv=kv))

        self.push_screen(KVPicker(self.source.state().kv, self.stats.header.get("kv_bytes_per_token", {})), picked)

    def action_cap(self, delta: int) -> None:
        self._control(Control(batch_cap=self.source.state().batch_cap + delta))

    def action_agents(self, delta: int) -> None:
        self._control(Control(agents=self.source.state().agents + delta))

    def action_autotune(self) -> None:
        on = self.source.state().autotune
        if on is None:
            self.notify("this engine has no tuner (swarmtune run or serve have one)", severity="warning")
            return
        self._control(Control(autotune=not on))

    def action_cycle_draft(self) -> None:
        cur = self.source.state().draft
        at = DRAFT_CYCLE.index(cur.label) if cur is not None and cur.label in DRAFT_CYCLE else -1
        self._control(Control(draft=DraftSetting.parse(DRAFT_CYCLE[(at + 1) % len(DRAFT_CYCLE)])))

    def action_pause(self) -> None:
        try:
            self.source.paused = not self.source.paused
        except UserError as e:
            self.notify(str(e), severity="error")
        self._dirty = self._force_status = True

    def _replay(self):
        if self.source.capabilities.seek:
            return self.source
        self.notify("only a replay can step, seek or change speed", severity="warning")
        return None

    def action_step_once(self) -> None:
        if (src := self._replay()) is not None:
            src.paused = True
            src.step_once()

    def action_seek(self, direction: int) -> None:
        if (src := self._replay()) is not None:
            n = len(src.rec.steps)
            src.seek(src.position + direction * max(1, n // 10))

    def action_speed(self, factor: float) -> None:
        if (src := self._replay()) is not None:
            src.speed = min(64.0, max(1 / 16, src.speed * factor))
            self._dirty = True

    def action_reset(self) -> None:
        self.stats.reset()
        self._dirty = True
        self.notify("statistics reset", timeout=2)

    def action_help(self) -> None:
        self.notify(REPLAY_HELP if self.source.capabilities.seek else LIVE_HELP, title="keys", timeout=10)

    def action_command(self) -> None:
        box = self.query_one("#command", Input)
        box.display = True
        box.focus()

    @on(Input.Submitted, "#command")
    def run_command(self, event: Input.Submitted) -> None:
        self._close_command()
        try:
            change = parse_command(event.value)
        except UserError as e:
            self.notify(str(e), severity="error")
            return
        self._control(change)  # the source checks its values, as it checks a flag or an HTTP body

    def _close_command(self) -> None:
        box = self.query_one("#command", Input)
        box.display = False
        box.value = ""
        self.query_one("#agents-box").focus()

    def key_escape(self) -> None:
        if self.query_one("#command", Input).display:
            self._close_command()

    def on_unmount(self) -> None:
        self.workers.cancel_all()
        sys.setswitchinterval(self._switch_interval_s)  # a process-wide setting: give it back


def run_app(source: Source) -> int:
    """The dashboard on a ready source, until the user quits; the source is closed after."""
    app = SwarmApp(source)
    try:
        app.run()
    finally:
        # free the engine only once the worker is out of it
        if app.stop_engine():
            source.close()
    return 0

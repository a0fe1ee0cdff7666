"""A live engine as a source: the engine stepped by the paced driver; simulated time plays at wall-clock
pace (unless the consumer wants the engine's full rate)."""

import threading
from collections.abc import Callable
from typing import Any

from swarmtune.engine.control import Control, EngineState
from swarmtune.engine.engine import Engine
from swarmtune.engine.errors import UserError
from swarmtune.engine.kv.types import read_kv
from swarmtune.engine.settings import cap_in_force, check_agents, check_batch_cap, check_residency
from swarmtune.sources.driver import drive
from swarmtune.sources.pacing import Pacer
from swarmtune.sources.protocol import Capabilities, Sink


class LiveSource:
    capabilities = Capabilities(controls=True, pause=True, seek=False)
    status = ""

    def __init__(self, engine: Engine | None, pace_sim: bool = True, build: Callable[[], Engine] | None = None,
                 preview: dict[str, Any] | None = None) -> None:
        """A built engine, or (later) one to build on the source's thread, shown meanwhile from `preview`."""
        self._engine = engine
        self._build = build
        self._preview = preview or {}
        self._early = Control()  # what was asked for before a deferred engine was built
        self._lock = threading.Lock()
        self._paused = False
        self._held = threading.Event()  # a pause holds: no step in flight, every record handed to the sink
        self.pace_sim = pace_sim
        source = engine.backend.source if engine is not None else self._preview.get("source")
        self.mode = "SIMULATED" if source == "simulated" else ""

    @classmethod
    def later(cls, build: Callable[[], Engine], preview: dict[str, Any], pace_sim: bool = True) -> "LiveSource":
        """An engine built on the source's own thread when it runs (loading a model takes a while): its consumer
        draws at once, from `preview` (engine/record/run_header.py's preview_header), and fills in as the
        engine comes."""
        return cls(None, pace_sim, build=build, preview=preview)

    @property
    def engine(self) -> Engine | None:
        """None until a deferred engine is built."""
        return self._engine

    @property
    def paused(self) -> bool:
        return self._paused

    @paused.setter
    def paused(self, value: bool) -> None:
        if value and not self._paused:
            self._held.clear()
        self._paused = value

    def wait_held(self, timeout_s: float) -> bool:
        """After pausing: True once the driver holds (the step in flight done and handed over), False if it
        did not within timeout_s (a long rebuild, or no driver running)."""
        return self._held.wait(timeout_s)

    def header(self) -> dict[str, Any]:
        return self._preview if self._engine is None else self._engine.header()

    def request(self, c: Control) -> EngineState:
        """Before a deferred engine is built, a control is checked as far as the flags allow (agents, cap,
        residency) and applied once the engine comes; what only the engine can check is checked then, and
        a refusal is said then (the sink's notice)."""
        if self._engine is not None:
            return self._engine.request(c)
        with self._lock:
            st = self.state()
            agents = check_agents(c.agents) if c.agents is not None else st.agents
            if c.batch_cap is not None:
                check_batch_cap(c.batch_cap, agents)
            if c.residency is not None:
                check_residency(c.residency)
            self._early = self._early.then(c)
            return self.state()

    def state(self) -> EngineState:
        if self._engine is not None:
            return self._engine.state()
        s, e = self._preview.get("settings") or {}, self._early
        agents = e.agents if e.agents is not None else int(s.get("agents", 0))
        cap = e.batch_cap if e.batch_cap is not None else int(s.get("batch_cap", 0))
        return EngineState(cap_in_force(cap, agents) if agents else cap, e.kv or read_kv(str(s.get("kv", "f16"))),
                           agents, e.residency or str(s.get("residency", "keep")))

    def run(self, sink: Sink, cancelled: Callable[[], bool]) -> None:
        if self._engine is None:
            assert self._build is not None
            sink.header(self._preview)  # every panel drawn now; the model loads meanwhile
            engine = self._build()
            with self._lock:
                early, self._early = self._early, Control()
                self._engine = engine
            if early.changes():
                try:
                    engine.request(early)
                except UserError as e:
                    sink.notice(f"asked for while the engine started, and refused: {e}")
        eng = self._engine
        eng.progress = sink.progress
        eng.should_stop = cancelled  # a long rebuild stops between its chunks
        eng.should_yield = lambda: self._paused or cancelled()
        if not eng.started:
            eng.start()
        sink.header(eng.header())
        # simulated time at wall-clock pace, or it outruns any screen
        pacer = Pacer() if eng.backend.source == "simulated" and self.pace_sim else None
        # a pause holds once the step launched ahead (overlap) has landed and gone to the sink: none is
        # launched while paused, so that one is the last
        drive(eng.step, sink, cancelled, lambda: self._paused and not eng.in_flight, pacer, on_held=self._held.set)

    def stop(self) -> None:
        pass  # the driver and the engine look at `cancelled` often enough

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()

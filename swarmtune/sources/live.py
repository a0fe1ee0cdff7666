"""A live engine as a source: the engine stepped by the paced driver; simulated time plays at wall-clock
pace (unless the consumer wants the engine's full rate)."""

import threading
from collections.abc import Callable
from typing import Any

from swarmtune.engine.control import Control, EngineState
from swarmtune.engine.engine import Engine
from swarmtune.sources.driver import drive
from swarmtune.sources.pacing import Pacer
from swarmtune.sources.protocol import Capabilities, Sink


class LiveSource:
    capabilities = Capabilities(controls=True, pause=True, seek=False)
    status = ""

    def __init__(self, engine: Engine, pace_sim: bool = True) -> None:
        self.engine = engine
        self._paused = False
        self._held = threading.Event()  # a pause holds: no step in flight, every record handed to the sink
        self.pace_sim = pace_sim
        self.mode = "SIMULATED" if engine.backend.source == "simulated" else ""

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
        return self.engine.header()

    def request(self, c: Control) -> EngineState:
        return self.engine.request(c)

    def state(self) -> EngineState:
        return self.engine.state()

    def run(self, sink: Sink, cancelled: Callable[[], bool]) -> None:
        eng = self.engine
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
        self.engine.close()

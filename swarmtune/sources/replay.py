"""A recording as a source: played at its recorded pace times a speed, with pause, single step and seek."""

import threading
from collections.abc import Callable
from typing import Any

from swarmtune.engine.control import Control, EngineState
from swarmtune.engine.errors import UserError
from swarmtune.engine.kv.types import known_kv
from swarmtune.engine.record.records import Recording, StepRecord
from swarmtune.sources.driver import SEEKED, Seeked, drive
from swarmtune.sources.pacing import Pacer
from swarmtune.sources.protocol import Capabilities, Sink


class ReplaySource:
    mode = "REPLAY"
    capabilities = Capabilities(controls=False, pause=True, seek=True)

    def __init__(self, recording: Recording, speed: float = 1.0) -> None:
        self.rec = recording
        self.pacer = Pacer(speed, max_sleep_s=0.5)  # short sleeps: a pause or seek answers promptly
        self.paused = False
        self.position = 0  # index of the next record to play
        self._lock = threading.Lock()
        self._jump: int | None = None
        self._single = 0

    @property
    def speed(self) -> float:
        return self.pacer.speed

    @speed.setter
    def speed(self, value: float) -> None:
        self.pacer.speed = value

    @property
    def status(self) -> str:
        cut = " (last line was cut)" if self.rec.skipped_partial else ""
        return f"step {self.position}/{len(self.rec.steps)} at {self.speed:g}x{cut}"

    def header(self) -> dict[str, Any]:
        return self.rec.header

    def request(self, c: Control) -> EngineState:
        raise UserError("replay is read-only: the recording's settings cannot change")

    def state(self) -> EngineState:
        last = self.rec.steps[max(0, self.position - 1)] if self.rec.steps else None
        return EngineState(last.batch_cap if last else 0, known_kv(last.kv_type) if last else None,
                           len(last.agents) if last else 0)

    def seek(self, index: int) -> None:
        with self._lock:
            self._jump = max(0, min(index, len(self.rec.steps)))

    def step_once(self) -> None:
        with self._lock:
            self._single += 1

    def run(self, sink: Sink, cancelled: Callable[[], bool]) -> None:
        sink.header(self.rec.header)
        steps = self.rec.steps

        def next_record() -> StepRecord | Seeked | None:
            with self._lock:
                jump, self._jump = self._jump, None
                if jump is not None:
                    self.position = jump
            if jump is not None:  # outside the lock: the consumer may be waiting on it to seek again
                sink.seeked(steps[:jump])
                self.pacer.reset()
                return SEEKED
            with self._lock:
                if self.paused:
                    if not self._single:
                        return None
                    self._single -= 1
                    self.pacer.reset()  # a single step plays at once
                if self.position >= len(steps):
                    return None
                self.position += 1
                return steps[self.position - 1]

        def held() -> bool:
            with self._lock:
                return self.paused and not self._single and self._jump is None

        drive(next_record, sink, cancelled, held, self.pacer)

    def stop(self) -> None:
        pass

    def close(self) -> None:
        pass

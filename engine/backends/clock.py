"""The engine's clock, which its backend chooses (`Backend.new_clock`): on a real backend the wall's, on a
simulated card the sum of what its steps are modeled to take. The engine asks the same questions of both
and never which one it has."""

import time
from collections.abc import Callable
from typing import Protocol

IDLE_SLICE_S = 0.05  # a real engine with every agent waiting for a tool sleeps this long per idle step
IDLE_WAIT_S = 0.5  # with every agent waiting for its client: at most this long, woken by a request


class Clock(Protocol):
    def start(self) -> None:
        """The run begins now (seconds count from here)."""

    def now_s(self) -> float:
        """Seconds since the run began."""

    def step_seconds(self, wall_s: float, backend_s: float) -> float:
        """What a step took: the wall's seconds, or the backend's (the sim's are modeled, not waited)."""

    def step_ended(self, seconds: float) -> float:
        """A step (or a move) that took these seconds was recorded: the time it ended."""

    def after(self, seconds: float) -> float:
        """The time at which a step that took these seconds, not yet recorded, ends."""

    def idle(self, ready_s: float | None, wait: Callable[[float], None]) -> float:
        """Every agent waits (for a tool that returns at ready_s, or for a client): the seconds an idle step
        takes, waiting through `wait` (which returns early where work arrives) where the time is the wall's."""


class WallClock:
    def __init__(self) -> None:
        self._t0: float | None = None

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def now_s(self) -> float:
        return 0.0 if self._t0 is None else time.perf_counter() - self._t0

    def step_seconds(self, wall_s: float, backend_s: float) -> float:
        return wall_s

    def step_ended(self, seconds: float) -> float:
        return self.now_s()  # the wall moved by itself

    def after(self, seconds: float) -> float:
        return self.now_s()

    def idle(self, ready_s: float | None, wait: Callable[[float], None]) -> float:
        return _waited(wait, min(ready_s - self.now_s(), IDLE_SLICE_S) if ready_s is not None else IDLE_WAIT_S)


class SimClock:
    """A simulated card's time: each step moves it by what the step is modeled to take; a tool's return is
    waited for by moving it there at once. A client's return is waited for on the wall (a real request)."""

    def __init__(self, now_s: float = 0.0) -> None:
        self._now_s = now_s

    def start(self) -> None:
        pass

    def now_s(self) -> float:
        return self._now_s

    def step_seconds(self, wall_s: float, backend_s: float) -> float:
        return backend_s

    def step_ended(self, seconds: float) -> float:
        self._now_s += seconds
        return self._now_s

    def after(self, seconds: float) -> float:
        return self._now_s + seconds

    def idle(self, ready_s: float | None, wait: Callable[[float], None]) -> float:
        if ready_s is not None:
            return max(0.0, ready_s - self._now_s)
        return _waited(wait, IDLE_WAIT_S)


def _waited(wait: Callable[[float], None], seconds: float) -> float:
    t0 = time.perf_counter()
    wait(max(0.0, seconds))
    return time.perf_counter() - t0

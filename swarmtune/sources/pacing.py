"""Plays record time (simulated seconds, or a recording's) at wall-clock pace, times a speed."""

import time
from collections.abc import Callable

SLICE_S = 0.05  # a long wait checks this often whether its caller wants to stop


class Pacer:
    def __init__(self, speed: float = 1.0, max_sleep_s: float | None = None) -> None:
        self._speed = speed
        self.max_sleep_s = max_sleep_s
        self._t0: float | None = None
        self._wall0 = 0.0

    @property
    def speed(self) -> float:
        return self._speed

    @speed.setter
    def speed(self, value: float) -> None:
        self._speed = value
        self.reset()  # re-anchor, or the new speed would apply to time already played

    def reset(self) -> None:
        """Forget the anchor (after a pause or a seek): the next record plays at once."""
        self._t0 = None

    def wait(self, t: float, cancelled: Callable[[], bool] = lambda: False) -> None:
        """Sleep until the wall clock reaches record time t (or the caller is cancelled)."""
        if self._t0 is None:
            self._t0, self._wall0 = t, time.perf_counter()
            return
        ahead = (t - self._t0) / self._speed - (time.perf_counter() - self._wall0)
        if self.max_sleep_s is not None:
            ahead = min(ahead, self.max_sleep_s)
        end = time.perf_counter() + ahead
        while ahead > 0 and not cancelled():
            time.sleep(min(ahead, SLICE_S))
            ahead = end - time.perf_counter()

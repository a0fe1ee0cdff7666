"""Waits between reconnection attempts: doubling from a first wait to a cap, back to the first on success."""

import time
from collections.abc import Callable

SLICE_S = 0.05


class Backoff:
    def __init__(self, first_s: float = 0.5, max_s: float = 5.0) -> None:
        self.first_s = first_s
        self.max_s = max_s
        self.next_s = first_s

    def reset(self) -> None:
        self.next_s = self.first_s

    def wait(self, cancelled: Callable[[], bool]) -> None:
        """Sleep the current wait (returning early when cancelled), then double it."""
        end = time.perf_counter() + self.next_s
        while not cancelled() and time.perf_counter() < end:
            time.sleep(SLICE_S)
        self.next_s = min(self.next_s * 2, self.max_s)

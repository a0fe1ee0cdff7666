"""The shape of served traffic, from its turns: what a turn generates, what the next prompt adds, how long
a conversation takes to come back. The engine's forecasts run this shape (engine/engine.py _follow_traffic)."""

import math
from collections import deque

from swarmtune.engine.agents.agent_source import TrafficShape

SHAPE_TURNS = 64  # the traffic's shape (what a turn generates, adds, waits) is the median of this many turns


def _bucket(x: float) -> int:
    """A median rounded to a step of about 25%, so the shape changes only when the traffic does."""
    if x <= 1:
        return 1
    return max(1, round(1.25 ** round(math.log(x) / math.log(1.25))))


def median(xs: "deque[int] | deque[float]") -> float:
    s = sorted(xs)
    return float(s[len(s) // 2])


class TrafficWatch:
    def __init__(self) -> None:
        self.gen: deque[int] = deque(maxlen=SHAPE_TURNS)
        self.added: deque[int] = deque(maxlen=SHAPE_TURNS)
        self.waits: deque[float] = deque(maxlen=SHAPE_TURNS)
        # the shape once a few turns have ended; None before. Worked out only when a turn ends or comes back,
        # since the engine asks every step
        self.shape: TrafficShape | None = None

    def turn_ended(self, generated: int) -> None:
        self.gen.append(generated)
        self._reshape()

    def came_back(self, gap_s: float, added: int) -> None:
        """A conversation's next prompt, gap_s after its reply, adding this many tokens to it."""
        self.waits.append(gap_s)
        self.added.append(added)
        self._reshape()

    def typical_wait_s(self) -> float | None:
        return median(self.waits) if self.waits else None

    def _reshape(self) -> None:
        if len(self.gen) < 4:
            return
        self.shape = TrafficShape(_bucket(median(self.gen)), _bucket(median(self.added)) if self.added else 1,
                                  round(median(self.waits), 1) if self.waits else 0.0)

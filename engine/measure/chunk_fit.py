"""What a prefill chunk costs at the size it runs, from the run's own chunks:
t(n, p) = c + d · p + n · (a + b · (p + n/2)), n tokens from position p.

The tuner's prefill model (prefill_model.py) forecasts whole re-prefills, where a call's fixed cost is noise;
sizing one chunk to a stall bound is where it is not. A call costs something whatever its size: c, every weight
read once (on a GPU about a decode step, so a 16-token chunk costs nearly what a 256-token one does), and d · p,
the sequence's cached cells read once, as a decode step reads them. On this project's 2-core EPYC, with the
default model and flash attention, d came out near 0.1 ms a cell: a 16-token chunk at position 6,144 took
0.72 s against 0.07 s at position 0, and a 256-token one 4.1 s.
The fit tells these apart from the chunk sizes and positions the run happened to use (tails of prompts, tool
results, full chunks while nothing decodes), so the bound's chunk follows the backend in use.
"""

import math
from collections import deque
from dataclasses import dataclass
from itertools import combinations

import numpy as np

MIN_SAMPLES = 3  # chunks timed before a fit is trusted with a bound


@dataclass(frozen=True)
class ChunkFit:
    per_call_seconds: float  # c
    per_call_position_seconds: float  # d: per call, per cached position it reads
    per_token_seconds: float  # a
    per_token_position_seconds: float  # b: per token, per cached position it reads
    samples: int

    def call_seconds(self, pos0: int) -> float:
        """What a call from pos0 costs before its first token: c + d · pos0."""
        return self.per_call_seconds + self.per_call_position_seconds * pos0

    def seconds(self, tokens: int, pos0: int) -> float:
        return self.call_seconds(pos0) + tokens * (self.per_token_seconds +
                                                   self.per_token_position_seconds * (pos0 + tokens / 2))

    def tokens_within(self, seconds: float, pos0: int, most: int) -> int:
        """The longest chunk from pos0, at most `most` tokens, the fit says takes at most `seconds` (0 if none)."""
        a, b, left = self.per_token_seconds, self.per_token_position_seconds, seconds - self.call_seconds(pos0)
        if left <= 0:
            return 0
        # n·(a + b·pos0) + (b/2)·n² = left: the positive root, in the form that stays exact as b goes to 0
        lin = a + b * pos0
        n = 2 * left / (lin + math.sqrt(lin * lin + 2 * b * left))
        return max(0, min(most, int(n)))


class ChunkTimes:
    """The latest timed chunks and their fit: least squares on relative error, every cost >= 0."""

    def __init__(self, max_samples: int = 64) -> None:
        # (tokens, first position, seconds)
        self._rows: deque[tuple[int, float, float]] = deque(maxlen=max_samples)
        self._fit: ChunkFit | None = None
        self._stale = False

    def add(self, tokens: int, pos0: int, seconds: float) -> None:
        if tokens > 0 and seconds > 0:
            self._rows.append((tokens, float(pos0), seconds))
            self._stale = True

    @property
    def fit(self) -> ChunkFit | None:
        if self._stale:
            self._fit, self._stale = self._refit(), False
        return self._fit

    def _refit(self) -> ChunkFit | None:
        if len(self._rows) < MIN_SAMPLES:
            return None
        r = np.array(self._rows, dtype=float)
        n, p0, y = r[:, 0], r[:, 1], r[:, 2]
        cols = np.column_stack([np.ones_like(n), p0, n, n * (p0 + n / 2)]) / y[:, None]
        best: tuple[float, np.ndarray] | None = None
        # the closest fit over the subsets of (c, d, a, b) that keep a and make no cost negative
        for k in (4, 3, 2, 1):
            for keep in combinations(range(4), k):
                if 2 not in keep:
                    continue
                sol, *_ = np.linalg.lstsq(cols[:, keep], np.ones(len(y)), rcond=None)
                if (sol < 0).any():
                    continue
                err = float(np.sum((cols[:, keep] @ sol - 1) ** 2))
                if best is None or err < best[0] - 1e-12:
                    coef = np.zeros(4)
                    coef[list(keep)] = sol
                    best = (err, coef)
        if best is None or best[1][2] <= 0:
            return None
        c, d, a, b = (float(x) for x in best[1])
        return ChunkFit(c, d, a, b, len(self._rows))

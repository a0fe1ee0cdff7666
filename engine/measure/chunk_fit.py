"""What a prefill chunk costs at the size it runs, from the run's own chunks: t(n, p) = c + n · (a + b · (p + n/2)).

The tuner's prefill model (prefill_model.py) forecasts whole re-prefills, where a call's fixed cost is noise;
sizing one chunk to a stall bound is where it is not. On a GPU a small chunk still reads every weight once,
so c is about a decode step and a 16-token chunk costs nearly what a 256-token one does; on a CPU, compute
dominates and c is near zero. The fit tells them apart from the chunk sizes the run happened to use (tails of
prompts, tool results, full chunks while nothing decodes), so the bound's chunk follows the backend in use.
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
    per_token_seconds: float  # a
    per_token_position_seconds: float  # b: per token, per cached position it reads
    samples: int

    def seconds(self, tokens: int, pos0: int) -> float:
        return self.per_call_seconds + tokens * (self.per_token_seconds +
                                                 self.per_token_position_seconds * (pos0 + tokens / 2))

    def tokens_within(self, seconds: float, pos0: int, most: int) -> int:
        """The longest chunk from pos0, at most `most` tokens, the fit says takes at most `seconds` (0 if none)."""
        a, b, left = self.per_token_seconds, self.per_token_position_seconds, seconds - self.per_call_seconds
        if left <= 0:
            return 0
        # n·(a + b·pos0) + (b/2)·n² = left: the positive root, in the form that stays exact as b goes to 0
        lin = a + b * pos0
        n = 2 * left / (lin + math.sqrt(lin * lin + 2 * b * left))
        return max(0, min(most, int(n)))


class ChunkTimes:
    """The latest timed chunks and their fit: least squares on relative error, every cost >= 0."""

    def __init__(self, max_samples: int = 64) -> None:
        self._rows: deque[tuple[int, float, float]] = deque(maxlen=max_samples)  # (tokens, mid position, seconds)
        self._fit: ChunkFit | None = None
        self._stale = False

    def add(self, tokens: int, pos0: int, seconds: float) -> None:
        if tokens > 0 and seconds > 0:
            self._rows.append((tokens, pos0 + tokens / 2, seconds))
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
        n, mid, y = r[:, 0], r[:, 1], r[:, 2]
        cols = np.column_stack([np.ones_like(n), n, n * mid]) / y[:, None]
        best: tuple[float, np.ndarray] | None = None
        # the closest fit over the subsets of (c, a, b) that keep a and make no cost negative
        for k in (3, 2, 1):
            for keep in combinations(range(3), k):
                if 1 not in keep:
                    continue
                sol, *_ = np.linalg.lstsq(cols[:, keep], np.ones(len(y)), rcond=None)
                if (sol < 0).any():
                    continue
                err = float(np.sum((cols[:, keep] @ sol - 1) ** 2))
                if best is None or err < best[0] - 1e-12:
                    coef = np.zeros(3)
                    coef[list(keep)] = sol
                    best = (err, coef)
        if best is None or best[1][1] <= 0:
            return None
        c, a, b = (float(x) for x in best[1])
        return ChunkFit(c, a, b, len(self._rows))

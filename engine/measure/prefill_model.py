"""The calibrated prefill-time model, per KV type: a chunk of n tokens from position p costs
n · (a + b · (p + n/2)) seconds.

a is the weights' and each token's own compute; b is attention over the cache already there, which every
token of the chunk reads. A constant rate (a alone) misses how prefill slows as an agent's history grows,
and how much that depends on the KV type: on this 2-core CPU, with the default model, a token at position
1,000 costs 1.3x one at 0 with an f16 cache and 2.1x with q8_0 (its flash-attention path dequantizes every
cell it reads), the opposite of decode, where q8_0 is the cheaper one. Chunks of tool output late in a
run are most of its prefill, and a KV switch re-prefills whole histories, so a forecast needs b.
"""

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class PrefillFit:
    per_token_seconds: float  # a
    per_token_position_seconds: float  # b: per token, per cached position it reads
    samples: int

    def seconds(self, tokens: int, pos0: int) -> float:
        return tokens * (self.per_token_seconds + self.per_token_position_seconds * (pos0 + tokens / 2))

    def scaled(self, factor: float) -> "PrefillFit":
        """Every chunk's time times factor: a model corrected by what its chunks measured against it."""
        return PrefillFit(self.per_token_seconds * factor, self.per_token_position_seconds * factor, self.samples)

    def attention_scaled(self, factor: float) -> "PrefillFit":
        """The cost that grows with the position (attention over the cached cells) times factor; the
        per-token cost of the weights as it was."""
        return PrefillFit(self.per_token_seconds, self.per_token_position_seconds * factor, self.samples)

    def record(self) -> dict[str, Any]:
        return {"per_token_seconds": self.per_token_seconds,
                "per_token_position_seconds": self.per_token_position_seconds, "samples": self.samples}


class PrefillCalibration:
    """Least squares on relative error over the latest chunks and any pinned ones (a probe's), both costs >= 0."""

    def __init__(self, max_samples: int = 64) -> None:
        self._pinned: list[tuple[int, float, float]] = []  # (tokens, mid position, seconds)
        self._recent: deque[tuple[int, float, float]] = deque(maxlen=max_samples)
        self.fit: PrefillFit | None = None

    def add(self, tokens: int, pos0: int, seconds: float, pinned: bool = False) -> None:
        if tokens <= 0 or seconds <= 0:
            return
        (self._pinned if pinned else self._recent).append((tokens, pos0 + tokens / 2, seconds))
        self.fit = self._refit()

    def _refit(self) -> PrefillFit | None:
        rows = self._pinned + list(self._recent)
        if not rows:
            return None
        a = np.array(rows, dtype=float)
        n, mid, y = a[:, 0], a[:, 1], a[:, 2]
        x = np.column_stack([n, n * mid]) / y[:, None]
        coef = np.zeros(2)
        # one row, or all at one position, cannot tell a from b: a alone
        if len(rows) >= 2 and np.ptp(mid) > 0:
            sol, *_ = np.linalg.lstsq(x, np.ones(len(y)), rcond=None)
            if (sol >= 0).all():
                coef = sol
        if not coef.any() or coef[0] <= 0:
            coef = np.array([float(np.linalg.lstsq(x[:, :1], np.ones(len(y)), rcond=None)[0][0]), 0.0])
        if coef[0] <= 0:
            return None
        return PrefillFit(float(coef[0]), float(coef[1]), len(rows))

"""The seed's bandwidth formula, and the batch-1 reference a measured speedup divides by.

The bandwidth-only formula treats a step as bytes moved; the calibrated step-time model, which adds
compute, is engine/measure/step_model.py.
"""

from collections import deque

import numpy as np


def predicted_speedup(batch: int, context: float, weight_bytes: float, kv_bytes_per_token: float) -> float:
    """S = B(W + L k) / (W + B L k): batch-B throughput over batch-1 throughput, both at context L.
    The dense, full-attention case of engine/model/bytes_model.py's ByteModel.speedup (windows, experts, state)."""
    w, lk = weight_bytes, context * kv_bytes_per_token
    return batch * (w + lk) / (w + batch * lk)


def crossover_context(batch: int, weight_bytes: float, kv_bytes_per_token: float) -> float:
    """L* = W / (B k): the context where each token's private KV read equals its share of the weights."""
    return weight_bytes / (batch * kv_bytes_per_token)


class BatchOneReference:
    """Batch-1 step time against context, t1(L) = a + b L, from timed batch-1 decode steps.

    A batch-1 step reads the weights and L cached tokens, so its time is a line in L. One step's time on
    a shared CPU is noisy (a spike doubles it now and then), so the line is a Theil-Sen fit (the median of
    the pairwise slopes): one outlier among the latest samples moves it little."""

    MAX_SAMPLES = 64

    def __init__(self, how: str) -> None:
        self.how = how
        self._samples: deque[tuple[float, float]] = deque(maxlen=self.MAX_SAMPLES)
        self._line: tuple[float, float] | None = None  # (a, b), refitted when a sample arrives
        self._range: tuple[float, float] | None = None  # the contexts timed (lo, hi), asked every decode step

    def add(self, context: float, seconds: float) -> None:
        if seconds <= 0:
            return
        self._samples.append((float(context), seconds))
        self._line = None
        self._range = None

    @property
    def ready(self) -> bool:
        return bool(self._samples)

    @property
    def samples(self) -> int:
        return len(self._samples)

    def _span(self) -> tuple[float, float]:
        if self._range is None:
            xs = [x for x, _ in self._samples]
            self._range = (min(xs), max(xs))
        return self._range

    def covers(self, context: float) -> bool:
        """Close enough to a measured context to compare against (no long extrapolation)."""
        if not self._samples:
            return False
        lo, hi = self._span()
        margin = max(128.0, 0.25 * hi)
        return lo - margin <= context <= hi + margin

    def _fit(self) -> tuple[float, float]:
        if self._line is None:
            a = np.array(self._samples)
            x, y = a[:, 0], a[:, 1]
            i, j = np.triu_indices(len(a), k=1)
            dx = x[j] - x[i]
            ok = dx != 0
            slope = float(np.median((y[j] - y[i])[ok] / dx[ok])) if ok.any() else 0.0
            slope = max(slope, 0.0)  # more cached tokens never make a step faster
            self._line = (float(np.median(y - slope * x)), slope)
        return self._line

    def seconds_at(self, context: float) -> float:
        a, b = self._fit()
        return a + b * context

    def as_dict(self) -> dict[str, object]:
        line = self._fit() if self._samples else None
        return {"how": self.how, "samples": len(self._samples),
                "line": {"seconds": line[0], "seconds_per_token": line[1]} if line else None}

"""The seed's bandwidth formula, and a step-time model fitted to this machine's own measurements.

The bandwidth-only formula treats a step as bytes moved; on a CPU, compute per token matters too,
so the calibrated model adds a per-token term: t(B, sum L) = a + b*B + c*sum L.
"""

from collections import deque
from dataclasses import dataclass

import numpy as np


def predicted_speedup(batch: int, context: float, weight_bytes: float, kv_bytes_per_token: float) -> float:
    """S = B(W + L k) / (W + B L k): batch-B throughput over batch-1 throughput, both at context L.
    The dense, full-attention case of engine/bytes_model.py's ByteModel.speedup (windows, experts, state)."""
    w, lk = weight_bytes, context * kv_bytes_per_token
    return batch * (w + lk) / (w + batch * lk)


def crossover_context(batch: int, weight_bytes: float, kv_bytes_per_token: float) -> float:
    """L* = W / (B k): the context where each token's private KV read equals its share of the weights."""
    return weight_bytes / (batch * kv_bytes_per_token)


@dataclass(frozen=True)
class Fit:
    fixed_seconds: float  # a: per step, whatever the batch (the weight stream, launch costs)
    per_token_seconds: float  # b: per sequence in the batch (compute, sampling)
    per_kv_token_seconds: float  # c: per cached token read (attention over KV)
    rms_relative_error: float  # over the samples it was fitted to
    samples: int

    def step_seconds(self, batch: int, total_context: float) -> float:
        return self.fixed_seconds + self.per_token_seconds * batch + self.per_kv_token_seconds * total_context

    def speedup(self, batch: int, context: float) -> float | None:
        """None where the fit predicts no time at all (a degenerate fit says nothing there)."""
        one, many = self.step_seconds(1, context), self.step_seconds(batch, batch * context)
        if one <= 0 or many <= 0:
            return None
        return batch * one / many


class Calibration:
    """Least squares on relative error, over the most recent decode steps and the startup probe."""

    def __init__(self, max_samples: int = 512) -> None:
        self._pinned: list[tuple[int, float, float]] = []  # probe points, never evicted
        self._recent: deque[tuple[int, float, float]] = deque(maxlen=max_samples)
        self.fit: Fit | None = None

    def add(self, batch: int, total_context: float, seconds: float, pinned: bool = False) -> None:
        if seconds <= 0:
            return
        (self._pinned if pinned else self._recent).append((batch, total_context, seconds))

    def refit(self) -> Fit | None:
        rows = self._pinned + list(self._recent)
        if len(rows) < 3:
            return self.fit
        a = np.array(rows, dtype=float)
        y = a[:, 2]
        x = np.column_stack([np.ones(len(a)), a[:, 0], a[:, 1]]) / y[:, None]
        # Least squares with every cost >= 0 (a negative cost is noise, not physics): drop the most
        # negative term and solve again, until none is negative.
        active = [0, 1, 2]
        coef = np.zeros(3)
        while active:
            sol, *_ = np.linalg.lstsq(x[:, active], np.ones(len(a)), rcond=None)
            if (sol >= 0).all():
                coef[active] = sol
                break
            active.pop(int(np.argmin(sol)))
        pred = coef[0] + coef[1] * a[:, 0] + coef[2] * a[:, 1]
        if pred.min() <= 0:
            return self.fit
        err = float(np.sqrt(np.mean(((pred - y) / y) ** 2)))
        self.fit = Fit(float(coef[0]), float(coef[1]), float(coef[2]), err, len(a))
        return self.fit


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

    def add(self, context: float, seconds: float) -> None:
        if seconds <= 0:
            return
        self._samples.append((float(context), seconds))
        self._line = None

    @property
    def ready(self) -> bool:
        return bool(self._samples)

    @property
    def samples(self) -> int:
        return len(self._samples)

    def covers(self, context: float) -> bool:
        """Close enough to a measured context to compare against (no long extrapolation)."""
        if not self._samples:
            return False
        xs = [x for x, _ in self._samples]
        lo, hi = min(xs), max(xs)
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

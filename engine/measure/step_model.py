"""The calibrated step-time model, per KV type: t = g(B) + c·N + d·Lmax, fitted to this machine's own steps.

N is the KV tokens the batch's attention reads (the sum of the contexts, fewer past a window), Lmax those
of its longest sequence. g(B) is
the cost of a step's batch apart from attention: the weight stream plus each sequence's compute. A line
a + b·B misses how that cost bends with B where compute saturates (on a GPU a step is flat in B until
the cores are busy; on some CPUs batch 2 costs twice batch 1 and batch 8 only 4.5 times), so g is
piecewise linear through knots at the batch sizes that ran, and a straight line between or beyond them.
The d·Lmax term is the critical path of a mixed batch: llama.cpp views every sequence's cache at the
longest one's length (masked past its own end) and splits attention among threads, so one long history
among short ones costs more than its share of N. A live q8_0 run of the default model (batches of mixed
contexts) showed it: the prequential median error fell from 5.8% to 4.5% with it. A sweep's batches
(equal contexts) cannot tell it from c.

The error it states is prequential: each step's time is predicted from the fit before that step was
learned, so it is the error a forecast made with the model would have had, not how well a curve
hugs the points it was drawn through.
"""

import statistics
from collections import deque
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

MAX_KNOTS = 8  # more knots than this fit the noise of a few steps, not the machine
# a machine drifts (a shared host, clocks, caches), and a live run's steps drift with their contexts in ways
# the terms here do not hold: a step this many steps old weighs half the latest one. Replayed over three
# 60 s live runs of the default model (q8_0, q8_0, f16), the prequential median error was 4.9%, 6.9% and
# 3.2% with all steps alike, 4.7%, 6.0% and 3.5% at a half-life of 64, and 2.9%, 3.2% and 1.8% at 16; a
# floor under the weights (old steps kept at 5%) undid most of it. Predicting 150 steps on (what a forecast
# leans on) it is no worse: 7.8% / 11.9% / 7.0% at 16 against 8.0% / 12.9% / 6.6% at 64.
# A sweep's pinned points all weigh 1.
HALF_LIFE_STEPS = 16


@dataclass(frozen=True)
class Fit:
    knots: tuple[tuple[int, float], ...]  # (batch, g(B) seconds), batch ascending; g is linear between
    per_kv_token_seconds: float  # c: per KV token attention reads
    rms_relative_error: float  # in-sample, over the samples it was fitted to
    samples: int
    median_error: float | None = None  # prequential: |predicted / measured - 1| over the latest steps
    checked: int = 0  # how many steps that median is over
    per_longest_token_seconds: float = 0.0  # d: per KV token of the batch's longest sequence
    # the per-sequence KV tokens (the longest in each step) its steps were timed at: past them it extrapolates
    timed_tokens: tuple[float, float] | None = None

    def timed_at(self, batch: float, kv_tokens: float) -> bool:
        """Whether a speedup at this batch and per-sequence KV tokens lies where steps were timed (batch 1
        and this batch inside the knots, the context inside the timed range), not extrapolated."""
        lo_b, hi_b = self.knots[0][0], self.knots[-1][0]
        if lo_b > 1 or batch > hi_b:  # a speedup divides by batch 1's step: both must have run
            return False
        if self.timed_tokens is None:
            return False
        lo, hi = self.timed_tokens
        return lo <= kv_tokens <= hi

    def batch_seconds(self, batch: float) -> float:
        """g(B): interpolated between knots; beyond them along a segment spanning at least a doubling of
        the batch (the last short one is mostly noise), never below zero."""
        (b0, g0) = self.knots[0]
        if len(self.knots) == 1:
            # one batch size ran: no telling the fixed cost from the per-sequence one; count it as fixed
            return g0
        xs = [b for b, _ in self.knots]
        if batch <= xs[0]:
            (b1, g1) = next((k for k in self.knots[1:] if k[0] >= 2 * b0), self.knots[-1])
        elif batch >= xs[-1]:
            (b1, g1) = self.knots[-1]
            (b0, g0) = next((k for k in reversed(self.knots[:-1]) if 2 * k[0] <= b1), self.knots[0])
        else:
            i = next(i for i, x in enumerate(xs) if x >= batch)
            (b0, g0), (b1, g1) = self.knots[i - 1], self.knots[i]
        return max(g0 + (g1 - g0) * (batch - b0) / (b1 - b0), 0.0)

    def step_seconds(self, batch: float, total_context: float, longest: float | None = None) -> float:
        """longest: KV tokens of the longest sequence; by default all are equal (total / batch)."""
        if longest is None:
            longest = total_context / batch if batch > 0 else 0.0
        return (self.batch_seconds(batch) + self.per_kv_token_seconds * total_context
                + self.per_longest_token_seconds * longest)

    def speedup(self, batch: int, context: float) -> float | None:
        """None where the fit predicts no time at all (a degenerate fit says nothing there)."""
        one, many = self.step_seconds(1, context), self.step_seconds(batch, batch * context)
        if one <= 0 or many <= 0:
            return None
        return batch * one / many

    def scaled(self, factor: float) -> "Fit":
        """Every step time times factor: a model corrected by what its steps measured against it."""
        return Fit(tuple((b, g * factor) for b, g in self.knots), self.per_kv_token_seconds * factor,
                   self.rms_relative_error, self.samples, self.median_error, self.checked,
                   self.per_longest_token_seconds * factor, self.timed_tokens)

    def attention_scaled(self, factor: float) -> "Fit":
        """The attention terms (what grows with the cached tokens) times factor, the batch cost as it was:
        a KV type differs from another in how it reads its cells, not in the weights a step streams."""
        return Fit(self.knots, self.per_kv_token_seconds * factor, self.rms_relative_error, self.samples,
                   self.median_error, self.checked, self.per_longest_token_seconds * factor, self.timed_tokens)

    @cached_property
    def record(self) -> dict[str, Any]:
        """As a record's `fit`: built once per refit, not once per step (every decode record carries it)."""
        return {"knots": [[b, g] for b, g in self.knots], "per_kv_token_seconds": self.per_kv_token_seconds,
                "per_longest_token_seconds": self.per_longest_token_seconds,
                "rms_error": self.rms_relative_error, "median_error": self.median_error, "checked": self.checked,
                "samples": self.samples, "timed_tokens": None if self.timed_tokens is None else list(self.timed_tokens)}

    @classmethod
    def from_record(cls, x: object) -> "Fit | None":
        """From a record's `fit`: this form, or the older line [a, b, c, rms] (g(B) = a + b·B)."""
        try:
            if isinstance(x, dict):
                knots = tuple((int(b), float(g)) for b, g in x["knots"])
                timed = x.get("timed_tokens")
                return cls(knots, float(x["per_kv_token_seconds"]), float(x["rms_error"]), int(x.get("samples", 0)),
                           None if x.get("median_error") is None else float(x["median_error"]),
                           int(x.get("checked", 0)), float(x.get("per_longest_token_seconds", 0.0)),
                           (float(timed[0]), float(timed[1])) if timed else None) if knots else None
            if isinstance(x, list | tuple) and len(x) >= 4:
                a, b, c, rms = (float(v) for v in x[:4])
                return cls(((1, a + b), (2, a + 2 * b)), c, rms, 0)
        except (KeyError, TypeError, ValueError):
            return None
        return None


def _knot_batches(batches: list[int]) -> list[int]:
    """The batch sizes that ran, thinned to at most MAX_KNOTS spread evenly on a log scale (ends kept)."""
    xs = sorted(set(batches))
    if len(xs) <= MAX_KNOTS:
        return xs
    lo, hi = np.log(xs[0]), np.log(xs[-1])
    want = np.exp(np.linspace(lo, hi, MAX_KNOTS))
    return sorted({min(xs, key=lambda x: abs(np.log(x) - np.log(w))) for w in want})


def _ramps(batch: np.ndarray, knots: list[int]) -> np.ndarray:
    """A basis for g(B) piecewise linear through the knots and never falling (one more sequence never makes
    a step cheaper): column 0 is 1; column j rises from 0 at knot j-1 to 1 at knot j and stays there. With
    every coefficient >= 0, g at knot k is the sum of the first k+1."""
    cols = [np.ones(len(batch))]
    for lo, hi in zip(knots, knots[1:], strict=False):
        cols.append(np.clip((batch - lo) / (hi - lo), 0.0, 1.0))
    return np.column_stack(cols)


class Calibration:
    """Least squares on relative error, over the most recent steps (the latest weighing most) and any
    pinned points (a sweep's)."""

    CHECKED_STEPS = 256  # the prequential error's window

    def __init__(self, max_samples: int = 512) -> None:
        # (batch, KV tokens, longest sequence's KV tokens, seconds)
        self._pinned: list[tuple[int, float, float, float]] = []  # never evicted
        self._recent: deque[tuple[int, float, float, float]] = deque(maxlen=max_samples)
        self._errors: deque[float] = deque(maxlen=self.CHECKED_STEPS)
        self.fit: Fit | None = None

    def add(self, batch: int, total_context: float, seconds: float, pinned: bool = False,
            longest: float | None = None, checked: bool = True) -> None:
        """checked=False: learned but not counted in the prequential error (a step timed outside the run)."""
        if seconds <= 0 or batch < 1:
            return
        if longest is None:
            longest = total_context / batch
        if self.fit is not None and checked:  # predicted before it is learned: the error a forecast would have had
            self._errors.append(abs(self.fit.step_seconds(batch, total_context, longest) / seconds - 1))
        (self._pinned if pinned else self._recent).append((batch, total_context, longest, seconds))

    @property
    def median_error(self) -> float | None:
        return statistics.median(self._errors) if self._errors else None

    def refit(self) -> Fit | None:
        rows = self._pinned + list(self._recent)
        if len(rows) < 3:
            return self.fit
        a = np.array(rows, dtype=float)
        batch, kv_tokens, longest, y = a[:, 0], a[:, 1], a[:, 2], a[:, 3]
        knots = _knot_batches([int(b) for b in batch])
        x = np.column_stack([_ramps(batch, knots), kv_tokens, longest]) / y[:, None]
        age = np.concatenate([np.zeros(len(self._pinned)), np.arange(len(self._recent))[::-1]])
        w = np.sqrt(0.5 ** (age / HALF_LIFE_STEPS))
        # least squares with every cost >= 0 (a negative cost, or a g that falls with B, is noise, not
        # physics): drop the most negative term and solve again, until none is negative
        n = x.shape[1]
        active = list(range(n))
        coef = np.zeros(n)
        while active:
            sol, *_ = np.linalg.lstsq(x[:, active] * w[:, None], w, rcond=None)
            if (sol >= 0).all():
                coef[active] = sol
                break
            active.pop(int(np.argmin(sol)))
        pred = x @ coef * y
        if pred.min() <= 0:
            return self.fit
        err = float(np.sqrt(np.mean(((pred - y) / y) ** 2)))
        g = np.cumsum(coef[:-2])
        self.fit = Fit(tuple((k, float(v)) for k, v in zip(knots, g, strict=True)), float(coef[-2]), err,
                       len(a), self.median_error, len(self._errors), float(coef[-1]),
                       (float(longest.min()), float(longest.max())))
        return self.fit

    def in_sample_median_error(self) -> float | None:
        """Median |error| of the current fit over the points it was fitted to (a sweep has no later steps)."""
        if self.fit is None:
            return None
        rows = self._pinned + list(self._recent)
        return statistics.median(abs(self.fit.step_seconds(b, n, m) / s - 1) for b, n, m, s in rows) if rows else None

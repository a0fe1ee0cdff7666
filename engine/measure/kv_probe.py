"""What a KV type costs on this machine, timed without touching the swarm.

A KV type the run has not used has no step-time fit of its own, and its speed cannot be told from its
bytes: a smaller type reads fewer bytes, but dequantizing it may cost more (slower on these CPUs, faster on
a GPU), and not alike in decode and in prefill. So it is timed: in a side cache (a second, temporary
context on the same model), the run's own type and the other one each prefill a history in chunks (each
chunk timed: prefill slows as the history grows) and decode a few steps of `batch` sequences at that
history's length and at a short one, and of one sequence at the short one.

Once an agent holds a history in the live cache, the history need not be prefilled: it is saved, converted
to each type (engine/kv/convert.py) and restored into the side cache, and the same decode points
are timed on it (probe_kv_converted). On a 2-core CPU that took 0.16x the prefilling probe's seconds
(bench/probe_cost.py, docs/tuner.md): cheap enough for a short run, where the other is not.

The decode ratios scale the run's own fit (engine/measure/step_model.py) to the other type: the cost of a step
apart from attention by the ratio of the two lines' intercepts, attention's per-token costs by the ratio
of their slopes. That fit stands for the type until it has run and has a fit of its own. Every point
timed also joins its type's fits (engine/tune/): at a run's start they are the only measurements there
are, and they let the tuner's first look come before the swarm has prefilled anything.
"""

import time
from dataclasses import dataclass, field
from typing import Any

from swarmtune.engine.backends.backend import Backend
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.measure.probe import filler_tokens, time_decode
from swarmtune.engine.measure.step_model import Fit

SHORT_CONTEXT = 64
# long enough for attention to show, short enough that the probe's prefills (most of its cost: ~0.75 s per
# type at 256 tokens on this 2-core CPU) stay small; a side cache stays small too
LONG_CONTEXT_MIN, LONG_CONTEXT_MAX = 256, 1024
PREFILL_CHUNK = 128  # the history is prefilled in chunks this long, each one timed at its position
STEPS, WARMUP = 3, 1  # per point: the median of 3 steps, after one that may rebuild the graph
PROBE_STEPS = 3 * (STEPS + WARMUP)  # decode steps a type's points take (three points), for an estimate of its cost
# below this share of the step, attention's slope is noise at these step counts: one ratio for the whole step
MIN_ATTENTION_SHARE = 0.1
# a ratio outside this is a probe's noise (a slope from medians of 3 steps), not a cache type: clamped
RATIO_BOUNDS = (0.25, 4.0)


@dataclass(frozen=True)
class KvProbe:
    kv: KVSetting  # the type timed
    base_kv: KVSetting  # the run's own type, timed alongside it
    batch: int
    contexts: tuple[int, int]  # tokens per sequence: short, long
    decode: dict[KVSetting, list[tuple[int, float, float]]]  # per type: (batch, mean context, seconds a step)
    prefill: dict[KVSetting, list[tuple[int, int, float]]]  # per type: (tokens, first position, seconds) per chunk
    wall_s: float  # what the probe took, side caches and their prefills (or conversions) included
    history: str = "prefilled"  # how the side caches got their history: prefilled, or converted from an agent's
    # per type, per decode point (in `decode`'s order): half the range of its timed steps' seconds (measured;
    # none: taken as exact)
    spread: dict[KVSetting, list[float]] = field(default_factory=dict)

    def _at(self, kv: KVSetting, batch: int) -> tuple[float, float]:
        """Seconds a step at the short and at the long context, at this batch."""
        lo, hi = (sec for b, _, sec in self.decode[kv] if b == batch)
        return lo, hi

    def _spread_at(self, kv: KVSetting, batch: int) -> tuple[float, float]:
        """How far the short and the long point's seconds may be off (0 where not measured)."""
        spreads = self.spread.get(kv) or [0.0] * len(self.decode[kv])
        lo, hi = (e for (b, _, _), e in zip(self.decode[kv], spreads, strict=True) if b == batch)
        return lo, hi

    def step_error(self, context: float) -> float:
        """How far a forecast's step time at this type may be off at `context` tokens per sequence (relative):
        the two types' lines through their points at the probe's batch, each point anywhere within its steps'
        spread, give the probed type's step over the base type's between two ends; this is the farther end
        from the ratio the forecast uses (`ratios` on the base line). Past the long point the lines are
        extrapolated, and a spread grows with the distance: a probe of short histories says little of long
        ones. Measured spreads; 0 where the probe kept none."""
        (lo, hi), lo_r, hi_r = self.contexts, *RATIO_BOUNDS
        w_hi = (context - lo) / (hi - lo)  # the long point's weight in the line's value at `context`
        w_lo = 1 - w_hi

        def ends(kv: KVSetting) -> tuple[float, float, float]:
            (t_lo, t_hi), (e_lo, e_hi) = self._at(kv, self.batch), self._spread_at(kv, self.batch)
            mid = w_lo * t_lo + w_hi * t_hi
            off = abs(w_lo) * e_lo + abs(w_hi) * e_hi
            return mid - off, mid, mid + off

        b_min, b_mid, b_max = ends(self.base_kv)
        x_min, _, x_max = ends(self.kv)
        fixed, per_token = self.ratios
        b_fixed, b_slope, _ = self._line(self.base_kv)
        used = (b_fixed * fixed + b_slope * context * per_token) / b_mid if b_mid > 0 else 1.0
        low = min(max(x_min / b_max, lo_r), hi_r) if b_max > 0 and x_min > 0 else lo_r
        high = min(max(x_max / b_min, lo_r), hi_r) if b_min > 0 else hi_r
        used = min(max(used, lo_r), hi_r)
        return max(high / used - 1, 1 - low / used)

    def _line(self, kv: KVSetting) -> tuple[float, float, float]:
        """(intercept, slope per context token, seconds at the long point) of kv's steps at the probe's batch."""
        (t_lo, t_hi), (lo, hi) = self._at(kv, self.batch), self.contexts
        slope = (t_hi - t_lo) / (hi - lo)
        return t_lo - slope * lo, slope, t_hi

    @property
    def ratios(self) -> tuple[float, float]:
        """(apart from attention, attention per token): the probed type's decode cost over the base type's."""
        (b_fixed, b_slope, b_hi), (x_fixed, x_slope, x_hi) = self._line(self.base_kv), self._line(self.kv)
        lo_r, hi_r = RATIO_BOUNDS
        if not self.split:
            whole = min(max(x_hi / b_hi, lo_r), hi_r)
            return whole, whole
        return min(max(x_fixed / b_fixed, lo_r), hi_r), min(max(x_slope / b_slope, lo_r), hi_r)

    @property
    def split(self) -> bool:
        """Whether attention showed enough in the base type's steps to be told from the rest (the probed
        type's may well be small: that is what it measures, bounded by RATIO_BOUNDS)."""
        (b_fixed, b_slope, b_hi), (x_fixed, x_slope, _) = self._line(self.base_kv), self._line(self.kv)
        return (b_slope * self.contexts[1] >= MIN_ATTENTION_SHARE * b_hi and x_slope > 0
                and b_fixed > 0 and x_fixed > 0)

    def scale(self, fit: Fit) -> Fit:
        """The base type's fit, scaled to the probed type: a forecast's step times until it runs."""
        fixed, per_token = self.ratios
        return Fit(tuple((b, g * fixed) for b, g in fit.knots), fit.per_kv_token_seconds * per_token,
                   fit.rms_relative_error, 0, None, 0, fit.per_longest_token_seconds * per_token)

    def record(self) -> dict[str, Any]:
        fixed, per_token = self.ratios
        return {"kv": self.kv.label, "base_kv": self.base_kv.label, "batch": self.batch,
                "contexts": list(self.contexts),
                "decode": {k: [[b, round(c, 1), round(s, 6)] for b, c, s in v] for k, v in self.decode.items()},
                "prefill": {k: [[n, p, round(s, 6)] for n, p, s in v] for k, v in self.prefill.items()},
                "ratio_fixed": round(fixed, 4), "ratio_per_token": round(per_token, 4), "ratio_split": self.split,
                "spread": {k: [round(e, 6) for e in v] for k, v in self.spread.items()},
                "probe_seconds": round(self.wall_s, 3), "history": self.history,
                "source": "measured in a side cache"}


def long_context(mean_context: float, ctx_per_agent: int) -> int:
    """The long point: twice the swarm's mean context (where its forecasts go), within the side cache's bounds
    and the per-agent context."""
    want = min(max(2 * mean_context, LONG_CONTEXT_MIN), LONG_CONTEXT_MAX)
    return int(max(2 * SHORT_CONTEXT, min(want, ctx_per_agent - STEPS - WARMUP - 8)))


Points = list[tuple[int, float, float]]  # (batch, mean context, seconds a step)


def _time_one(backend: Backend, batch: int, long: int) -> tuple[Points, list[float], list[tuple[int, int, float]]]:
    """In the side cache: the history prefilled chunk by chunk, then the decode points and their spreads."""
    tokens = filler_tokens(backend, long)
    prefill = []
    step = min(PREFILL_CHUNK, backend.max_chunk_tokens)
    for pos in range(0, long, step):
        chunk = tokens[pos : pos + step]
        prefill.append((len(chunk), pos, backend.steps.prefill(0, chunk, pos)))
    return *decode_points(backend, batch, long), prefill


def decode_points(backend: Backend, batch: int, long: int) -> tuple[Points, list[float]]:
    """With sequence 0 holding `long` tokens: (batch, mean context, seconds a step) at that history for
    `batch` sequences, and at the short point for `batch` and for one, with each point's spread (half the
    range of its steps' seconds); sequence 0 is left cut to the short point."""
    mid = WARMUP + (STEPS + 1) / 2  # a step at position L + i reads L + i + 1 cells
    timed = [(long + mid, time_decode(backend, batch, long, STEPS, WARMUP, filled=True))]
    backend.cells.truncate(0, SHORT_CONTEXT)  # the same cells, cut to the short point
    for b in (batch, 1) if batch > 1 else (1,):
        timed.append((SHORT_CONTEXT + mid, time_decode(backend, b, SHORT_CONTEXT, STEPS, WARMUP, filled=True)))
    timed.sort(key=lambda p: (p[1].batch, p[0]))
    return [(t.batch, c, t.seconds_per_step) for c, t in timed], [t.spread_s for _, t in timed]


def probe_kv(backend: Backend, base_kv: KVSetting, kv: KVSetting, batch: int, long: int) -> KvProbe:
    """Times base_kv and kv alike in side caches of `batch` sequences; the live cache is left as it was.
    Raises UserError where this build cannot make a context of that type."""
    t0 = time.perf_counter()
    decode, spread, prefill = {}, {}, {}
    for k in (base_kv, kv):
        with backend.side_cache(k, batch, long + STEPS + WARMUP + 8):
            decode[k], spread[k], prefill[k] = _time_one(backend, batch, long)
    return KvProbe(kv, base_kv, batch, (SHORT_CONTEXT, long), decode, prefill, time.perf_counter() - t0,
                   spread=spread)


def probe_kv_converted(backend: Backend, base_kv: KVSetting, kv: KVSetting, batch: int, seq: int,
                       long: int) -> KvProbe:
    """Times base_kv and kv alike in side caches of `batch` sequences, each given the live cache's sequence
    `seq` (at base_kv, holding at least `long` tokens from position 0) converted to its type and cut to
    `long`: no prefill. The live cache is left as it was. Raises UserError where this build cannot make a
    context of that type, Unconvertible where the history cannot be converted to it."""
    t0 = time.perf_counter()
    saved, _, _ = backend.cells.save_seq(seq)
    held = backend.cells.span(seq)[1] + 1
    decode, spread = {}, {}
    for k in (base_kv, kv):
        handle = saved if k == base_kv else backend.cells.convert_saved(saved, k)[0]
        # the whole history is restored (a saved state is one piece), then cut to the long point
        with backend.side_cache(k, batch, max(held, long) + STEPS + WARMUP + 8):
            backend.cells.restore_seq(0, handle)
            backend.cells.truncate(0, long)
            decode[k], spread[k] = decode_points(backend, batch, long)
    return KvProbe(kv, base_kv, batch, (SHORT_CONTEXT, long), decode, {}, time.perf_counter() - t0,
                   history="converted", spread=spread)

"""The tuner's closed loop: after a change, what the new setting measures against what its forecast said.

A forecast is only as good as the step times it ran on. For a setting the run had not used, those are a
model (a KV type's probe-scaled fit, a batch size past the fit's knots), and that model can be wrong by a
quarter on a machine unlike the one it was tried on (q8_0's attention is 0.3-0.45x f16's per token on
some of these CPUs and 1.22x on others). So every step the new setting runs is timed against what the
forecast's own simulator says that step should take, for the batch and contexts actually served: their
ratio q (measured over modeled) is the forecast's step-time error, found on the run's own steps and
normalised for its contexts. If every step takes q times what was forecast, the setting delivers about
(1 + gain) / q of staying's objective instead of 1 + gain. Once that is below staying by more than the
noise of q (its standard error over the steps seen), the change is measurably worse and is reverted.
The verdict comes as soon as it is significant, not at a fixed horizon.

A KV switch is judged more closely (engine/tune/): decode and prefill steps keep a q each (a cache type
can be faster in one and slower in the other), the type's model is scaled by them, and the rest of the
run is forecast again both ways, so that what a type does to the budget is counted too.
"""

import math
import statistics
from dataclasses import dataclass, field
from typing import Protocol

from swarmtune.engine.records import StepRecord

Z = 2.0  # about 95% one-sided: a setting is judged worse only past twice the standard error of its q
MIN_STEPS = 8  # decode steps before any verdict (the first after a switch aside)
TOLERANCE = 0.01  # a loss this small is within what a setting costs to change back
# consecutive steps share the machine's state (clocks, caches, a neighbour's load): count them as half
AUTOCORRELATION = 2.0
# a new context's first step of each kind also builds that graph shape: not what the setting costs
WARMUP_STEPS = 1


def verdict(measured_gain: float | None, predicted_gain: float | None, stated_error: float | None) -> str | None:
    """How an outcome compares with its forecast. 'inconclusive' where the error stated for the span is
    larger than the gain it judges (such an error agrees with anything); else 'agrees' within the stated
    error, 'disagrees' past it. None where something is missing."""
    if measured_gain is None or predicted_gain is None or stated_error is None:
        return None
    if stated_error > abs(predicted_gain):
        return "inconclusive"
    return "agrees" if abs(measured_gain - predicted_gain) <= stated_error else "disagrees"


class StepCost(Protocol):
    """What the forecast's simulator says a step costs: the model a decision was made on."""

    def decode_seconds(self, batch: int, contexts: list[float], kv: str) -> float: ...

    def prefill_seconds(self, tokens: int, pos0: int, kv: str) -> float: ...

    def move_seconds(self, nbytes: int) -> float: ...

    def decode_base_seconds(self, batch: int, kv: str) -> float:
        """The part of a decode step that does not grow with the cached tokens (the weights' stream)."""
        ...

    def prefill_base_seconds(self, tokens: int, kv: str) -> float:
        """The part of a prefill chunk that does not grow with its position."""
        ...

    def corrected(self, kv: str, decode: float, prefill: float, decode_base_share: float = 0.0,
                  prefill_base_share: float = 0.0) -> tuple: ...

    @property
    def calibrated(self) -> bool:
        """A model calibrated on this run (a real backend), whose per-type fits a measurement can correct;
        not the sim profile, which is the card itself."""
        ...


@dataclass
class Ratio:
    """Measured over modeled seconds of one kind of step, time-weighted, with its noise."""

    measured_s: float = 0.0
    modeled_s: float = 0.0
    base_s: float = 0.0  # of modeled_s, what does not grow with the cached tokens
    log_ratios: list[float] = field(default_factory=list)

    def add(self, measured: float, modeled: float, base: float = 0.0) -> None:
        if modeled <= 0 or measured <= 0:
            return
        self.measured_s += measured
        self.modeled_s += modeled
        self.base_s += min(max(base, 0.0), modeled)
        self.log_ratios.append(math.log(measured / modeled))

    @property
    def base_share(self) -> float:
        """How much of the modeled time does not grow with the cached tokens: a correction of a KV type's
        model scales the rest (its attention), where the rest is large enough to be told apart."""
        return self.base_s / self.modeled_s if self.modeled_s > 0 else 0.0

    @property
    def q(self) -> float | None:
        return self.measured_s / self.modeled_s if self.modeled_s > 0 else None

    @property
    def stderr(self) -> float | None:
        """The standard error of log q: the steps' own spread over the steps seen."""
        n = len(self.log_ratios)
        if n < 3:
            return None
        return statistics.stdev(self.log_ratios) / math.sqrt(n / AUTOCORRELATION)

    def bounds(self) -> tuple[float, float, float]:
        """(q, its favourable end, its unfavourable end): 1 for each where nothing was measured, so an
        unmeasured kind keeps its model."""
        q, se = self.q, self.stderr
        if q is None:
            return 1.0, 1.0, 1.0
        se = se if se is not None else 0.0
        return q, q * math.exp(-Z * se), q * math.exp(Z * se)


@dataclass
class Watch:
    """One change being checked, step by step, against the model its forecast ran on."""

    kv: str  # the setting's KV type: steps at another type are from before the switch
    predicted_gain: float  # the forecast gain the change was made on
    model: StepCost
    trial: bool = False  # made to measure a type its model could not judge: kept only past the margin
    total: Ratio = field(default_factory=Ratio)  # every step and move
    decode: Ratio = field(default_factory=Ratio)
    prefill: Ratio = field(default_factory=Ratio)
    decode_steps: int = 0
    checks: int = 0  # re-forecasts made with the measured ratios
    seen: dict[str, int] = field(default_factory=dict)  # steps of each kind, warm-up included

    def add(self, r: StepRecord) -> None:
        """A step of the new setting: its measured seconds and what the forecast's model says it costs."""
        self.seen[r.kind] = self.seen.get(r.kind, 0) + 1
        if r.kind in ("decode", "prefill") and self.seen[r.kind] <= WARMUP_STEPS:
            return
        modeled = 0.0
        if r.kind == "decode" and r.batch and r.seconds > 0:
            ctx = {a.id: a.context for a in r.agents}
            contexts = [float(ctx.get(i, r.mean_context)) for i in r.batch_ids]
            modeled = self.model.decode_seconds(r.batch, contexts, r.kv_type)
            self.decode.add(r.seconds, modeled, self.model.decode_base_seconds(r.batch, r.kv_type))
            self.decode_steps += 1
        elif r.kind == "prefill" and r.tokens and r.batch_ids and r.seconds > 0:
            after = next((a.context for a in r.agents if a.id == r.batch_ids[0]), r.tokens)
            modeled = self.model.prefill_seconds(r.tokens, max(after - r.tokens, 0), r.kv_type)
            self.prefill.add(r.seconds, modeled, self.model.prefill_base_seconds(r.tokens, r.kv_type))
        measured = r.seconds if modeled > 0 else 0.0
        for m in r.moved:
            if m.op in ("swap_out", "swap_in") and m.seconds > 0:
                measured += m.seconds
                modeled += self.model.move_seconds(m.bytes)
        self.total.add(measured, modeled)

    def correction(self, kv: str, decode: float | None = None, prefill: float | None = None) -> tuple:
        """The model of kv corrected by what its steps measured (by default their central q of each kind)."""
        return self.model.corrected(kv, self.decode.bounds()[0] if decode is None else decode,
                                    self.prefill.bounds()[0] if prefill is None else prefill,
                                    self.decode.base_share, self.prefill.base_share)

    @property
    def q(self) -> float | None:
        """Measured over modeled seconds, over every step seen (time-weighted)."""
        return self.total.q

    @property
    def q_stderr(self) -> float | None:
        return self.total.stderr

    @property
    def ready(self) -> bool:
        return self.decode_steps >= MIN_STEPS and self.q_stderr is not None

    def realised_gain(self) -> tuple[float, float, float] | None:
        """(gain, its upper bound, its lower bound): the forecast gain redone as if every step took q times
        what was forecast (a change of cap or residency; a KV change is re-forecast, engine/tune/)."""
        q, se = self.q, self.q_stderr
        if q is None or se is None:
            return None
        g = 1 + self.predicted_gain
        return g / q - 1, g / (q * math.exp(-Z * se)) - 1, g / (q * math.exp(Z * se)) - 1

    def worse(self) -> bool:
        """Measurably worse than staying: even at the favourable end of q's noise it loses."""
        g = self.realised_gain() if self.ready else None
        return g is not None and g[1] < -TOLERANCE

    def confirmed(self) -> bool:
        """Measurably no worse than staying: at the unfavourable end of q's noise it still gains."""
        g = self.realised_gain() if self.ready else None
        return g is not None and g[2] >= 0

    def describe(self, gain: tuple[float, float, float] | None = None) -> str:
        g = gain or self.realised_gain()
        if g is None:
            return "not enough steps yet"
        parts = [f"{name} {r.q:.2f}x (±{Z * r.stderr:.0%})" for name, r in (("decode", self.decode),
                 ("prefill", self.prefill)) if r.q is not None and r.stderr is not None]
        took = ", ".join(parts) or f"{self.q:.2f}x"
        return (f"its steps took {took} the forecast's step times over {self.decode_steps} decode steps: "
                f"{g[0]:+.1%} against staying, between {g[2]:+.1%} and {g[1]:+.1%} (measured)")

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
"""

import math
import statistics
from dataclasses import dataclass, field
from typing import Protocol

from swarmtune.engine.records import StepRecord

Z = 2.0  # about 95% one-sided: a setting is judged worse only past twice the standard error of its q
MIN_STEPS = 12  # decode steps before any verdict: fewer are the noise of a few steps
TOLERANCE = 0.01  # a loss this small is within what a setting costs to change back
# consecutive steps share the machine's state (clocks, caches, a neighbour's load): count them as half
AUTOCORRELATION = 2.0
VERDICTS = ("agrees", "disagrees", "inconclusive")


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


@dataclass
class Watch:
    """One change being checked, step by step, against the model its forecast ran on."""

    kv: str  # the setting's KV type: steps at another type are from before the switch
    predicted_gain: float  # the forecast gain the change was made on
    model: StepCost
    measured_s: float = 0.0
    modeled_s: float = 0.0
    decode_steps: int = 0
    log_ratios: list[float] = field(default_factory=list)

    def add(self, r: StepRecord) -> None:
        """A step of the new setting: its measured seconds and what the forecast's model says it costs."""
        if r.kind == "decode" and r.batch and r.seconds > 0:
            ctx = {a.id: a.context for a in r.agents}
            contexts = [float(ctx.get(i, r.mean_context)) for i in r.batch_ids]
            modeled = self.model.decode_seconds(r.batch, contexts, r.kv_type)
            self.decode_steps += 1
        elif r.kind == "prefill" and r.tokens and r.batch_ids and r.seconds > 0:
            after = next((a.context for a in r.agents if a.id == r.batch_ids[0]), r.tokens)
            modeled = self.model.prefill_seconds(r.tokens, max(after - r.tokens, 0), r.kv_type)
        else:
            modeled = 0.0
        moved = [m for m in r.moved if m["op"] in ("swap_out", "swap_in") and m["seconds"] > 0]
        measured = r.seconds if modeled > 0 else 0.0
        for m in moved:
            measured += m["seconds"]
            modeled += self.model.move_seconds(m["bytes"])
        if modeled <= 0 or measured <= 0:
            return
        self.measured_s += measured
        self.modeled_s += modeled
        self.log_ratios.append(math.log(measured / modeled))

    @property
    def q(self) -> float | None:
        """Measured over modeled seconds, over the steps seen (time-weighted)."""
        return self.measured_s / self.modeled_s if self.modeled_s > 0 else None

    @property
    def q_stderr(self) -> float | None:
        """The standard error of log q: the steps' own spread over the steps seen."""
        n = len(self.log_ratios)
        if n < 3:
            return None
        return statistics.stdev(self.log_ratios) / math.sqrt(n / AUTOCORRELATION)

    def realised_gain(self) -> tuple[float, float] | None:
        """(gain, its upper bound): the forecast gain redone with the step times this setting measured."""
        q, se = self.q, self.q_stderr
        if q is None or se is None:
            return None
        gain = (1 + self.predicted_gain) / q - 1
        best = (1 + self.predicted_gain) / (q * math.exp(-Z * se)) - 1
        return gain, best

    def worse(self) -> bool:
        """Measurably worse than staying: even at the favourable end of q's noise it loses."""
        if self.decode_steps < MIN_STEPS:
            return False
        g = self.realised_gain()
        return g is not None and g[1] < -TOLERANCE

    def confirmed(self) -> bool:
        """Measurably no worse than staying: at the unfavourable end of q's noise it still gains."""
        q, se = self.q, self.q_stderr
        if self.decode_steps < MIN_STEPS or q is None or se is None:
            return False
        return (1 + self.predicted_gain) / (q * math.exp(Z * se)) - 1 >= 0

    def describe(self) -> str:
        q, se, g = self.q, self.q_stderr, self.realised_gain()
        if q is None or g is None or se is None:
            return "not enough steps yet"
        return (f"its steps took {q:.2f}x the forecast's step times (±{Z * se:.0%}, {self.decode_steps} decode "
                f"steps): {g[0]:+.1%} against staying, at best {g[1]:+.1%} (measured)")

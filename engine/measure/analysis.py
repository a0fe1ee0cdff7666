"""What a step means beyond what it did: the byte model's prediction, the step-time fit, the batch-1
reference a measured speedup divides by, and the energy ledger. The engine says what a step did; this
unit annotates it, one fit and one reference per KV cache type (the step time depends on it)."""

import copy
import math
from collections.abc import Callable

from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.measure.chunk_fit import ChunkFit, ChunkTimes
from swarmtune.engine.measure.power.ledger import EnergyLedger
from swarmtune.engine.measure.power.meter import StepPower
from swarmtune.engine.measure.speedup import BatchOneReference
from swarmtune.engine.measure.step_model import Calibration, Fit
from swarmtune.engine.model.bytes_model import StepRead
from swarmtune.engine.model.model_facts import ModelFacts
from swarmtune.engine.record.records import StepRecord, mean_context

REFIT_EVERY_STEPS = 8  # a refit is ~0.5 ms over 512 steps: under 0.2% of a step here
# A batch-1 decode step now and then is the reference a measured speedup divides by: often until a few
# contexts are covered, then as rarely as keeps its cost under a share of the run's throughput. A reference
# step gives one token in t1 where the batch gives B in tB, so one in N costs about (t1/tB - 1/B) / N of the
# time: from this CPU's 0.6 at batch 8 to a GPU's, where t1 is nearer tB, the cadence is measured, not fixed.
REFERENCE_EVERY_STEPS_WARMUP = 8
REFERENCE_EVERY_STEPS = 64  # until a step-time fit exists: this CPU's cadence at batch 8
REFERENCE_EVERY_MAX_STEPS = 512
REFERENCE_COST_SHARE = 0.01
REFERENCE_WARM_SAMPLES = 6


class StepAnalysis:
    def __init__(self, facts: ModelFacts, source: str, watts_at: Callable[[int], float] | None) -> None:
        self.bytes_model = facts.bytes_model
        self.watts_at = watts_at  # a modeled meter's watts per batch; None for a sensor
        self.how = (f"measured during the run: a batch-1 decode step as often as costs "
                    f"{REFERENCE_COST_SHARE:.0%} of throughput at the measured step times "
                    f"(every {REFERENCE_EVERY_STEPS_WARMUP} at first), a robust line through the latest 64"
                    if source == "measured" else
                    "simulated: batch-1 steps of the profile's roofline interleaved in the run")
        self.ledger = EnergyLedger()
        self._calibrations: dict[KVSetting, Calibration] = {}
        self._references: dict[KVSetting, BatchOneReference] = {}
        self.chunks: dict[KVSetting, ChunkTimes] = {}  # per KV setting: the prefill chunks timed
        self._decodes = 0
        self._fresh_context = True
        self.open_s: float | None = None  # what opening the run's context took (measured; None: not timed)
        # a tuner's forecast (engine/tune/) needs only when its batch-1 reference steps fall, not what each
        # step implies: the fits, speedups and energy a record carries cost a third of a forecast's time
        self.forecasting = False

    def context_opened(self, seconds: float | None = None) -> None:
        """A new llama.cpp context: its first batch-1 step also builds that graph shape, so it is no reference.
        seconds: what opening it took (measured, the run's first): a KV switch opens one the same size."""
        self._fresh_context = True
        if seconds is not None:
            self.open_s = seconds

    def fit(self, kv: KVSetting) -> Fit | None:
        """The step-time fit measured at this KV type, if any steps ran at it."""
        c = self._calibrations.get(kv)
        return c.fit if c is not None else None

    def measured_kv(self) -> list[KVSetting]:
        """The KV settings some steps were timed at (types, or K/V pairs as "q8_0/f16")."""
        return list(self._calibrations)

    def chunk_timed(self, kv: KVSetting, tokens: int, pos0: int, seconds: float) -> None:
        self.chunks.setdefault(kv, ChunkTimes()).add(tokens, pos0, seconds)

    def chunk_fit(self, kv: KVSetting) -> ChunkFit | None:
        """What a prefill chunk costs at its size, from the chunks timed at this KV setting; None before enough ran."""
        c = self.chunks.get(kv)
        return c.fit if c is not None else None

    def chunk_within(self, kv: KVSetting, seconds: float, pos0: int, most: int) -> int | None:
        """The longest prefill chunk from pos0 (at most `most`) the fit says takes at most `seconds`; None: no fit."""
        fit = self.chunk_fit(kv)
        return fit.tokens_within(seconds, pos0, most) if fit is not None else None

    def chunk_seconds(self, kv: KVSetting, tokens: int, pos0: int) -> float | None:
        """What a prefill chunk of `tokens` from pos0 takes as its own call, by the fit; None: no fit."""
        fit = self.chunk_fit(kv)
        return fit.seconds(tokens, pos0) if fit is not None else None

    def calibration(self, kv: KVSetting) -> Calibration:
        return self._calibrations.setdefault(kv, Calibration())

    def reference(self, kv: KVSetting) -> BatchOneReference:
        return self._references.setdefault(kv, BatchOneReference(self.how))

    def _reference_step(self, kv: KVSetting, mean_ctx: float, seconds: float) -> None:
        """A batch-1 step: a reference sample, unless it was a fresh context's first (which builds the graph)."""
        if not self._fresh_context:
            self.reference(kv).add(mean_ctx, seconds)
        self._fresh_context = False

    def carry_references(self, other: "StepAnalysis") -> None:
        """Another analysis's batch-1 references, copied: a forecast takes its reference steps when the run
        it forecasts would (they cost the run throughput: one agent alone for a step)."""
        self._references = {k: copy.deepcopy(v) for k, v in other._references.items()}

    def reference_due(self, kv: KVSetting, contexts: list[int], steps_since: int) -> bool:
        """Whether the next decode step should run one agent alone to time the batch-1 reference."""
        if len(contexts) < 2:
            return False
        ref = self.reference(kv)
        mean_ctx = mean_context(contexts)
        cold = ref.samples < REFERENCE_WARM_SAMPLES or not ref.covers(mean_ctx)
        if cold or steps_since < REFERENCE_EVERY_STEPS_WARMUP:
            return steps_since >= REFERENCE_EVERY_STEPS_WARMUP
        return steps_since >= self.reference_every(kv, contexts)

    def reference_every(self, kv: KVSetting, contexts: list[int]) -> int:
        """Decode steps between two batch-1 references at this batch and these contexts: the fewest that keep
        their cost under REFERENCE_COST_SHARE of the time, from the measured batch-1 line and step fit."""
        fit, ref = self.fit(kv), self.reference(kv)
        if fit is None or not ref.ready:
            return REFERENCE_EVERY_STEPS
        b = len(contexts)
        t_batch = fit.step_seconds(b, float(sum(contexts)), float(max(contexts)))
        if t_batch <= 0:
            return REFERENCE_EVERY_STEPS
        cost = ref.seconds_at(mean_context(contexts)) / t_batch - 1 / b  # of one batch step's time
        every = math.ceil(cost / REFERENCE_COST_SHARE) if cost > 0 else REFERENCE_EVERY_STEPS_WARMUP
        return min(max(every, REFERENCE_EVERY_STEPS_WARMUP), REFERENCE_EVERY_MAX_STEPS)

    def annotate(self, rec: StepRecord, contexts: list[int], read: StepRead | None,
                 power: StepPower | None) -> None:
        """Adds to a decode step's record what its numbers imply (all modeled but measured_speedup)."""
        # a draft model's calls before the step are the swarm's time, not the step's: the fits and the
        # reference learn the step alone
        b, kv, seconds = rec.batch, rec.kv, rec.seconds - rec.drafting_s
        if rec.kind != "decode" or not b:
            return
        mean_ctx = rec.mean_context
        if rec.drafted or rec.prefill_tokens:
            # a verify step computes more rows than it has agents, a mixed one a prefill chunk besides: the fits,
            # the reference and the energy ledger learn from plain steps; a verify step's speedup counts the
            # tokens its agents kept (a mixed step's has no like to compare with)
            ref = self.reference(kv)
            if rec.drafted and ref.covers(mean_ctx) and seconds > 0:
                rec.measured_speedup = rec.tokens * ref.seconds_at(mean_ctx) / seconds
            return
        if self.forecasting:
            if b == 1:
                self._reference_step(kv, mean_ctx, seconds)
            return
        if power is not None:
            self.ledger.add(b, power.joules, rec.tokens, rec.seconds)  # the energy of its whole wall time
        if read is not None:  # what the step read, computed once by the engine for its record
            rec.predicted_speedup = read.speedup
        cal = self.calibration(kv)
        # the fit's KV term counts what attention reads: past a window, fewer tokens than the context;
        # derived from the KV bytes the record already holds rather than summed over the layers again
        k = self.bytes_model.kv_bytes_per_token(kv)
        kv_tokens = rec.kv_bytes / k if k > 0 else float(sum(contexts))
        longest = self.bytes_model.kv_equivalent_tokens(kv, max(contexts)) if contexts else kv_tokens / b
        cal.add(b, kv_tokens, seconds, longest=longest)
        if self._decodes % REFIT_EVERY_STEPS == 0 or cal.fit is None:
            cal.refit()
        self._decodes += 1
        fit = cal.fit
        if fit is not None:
            rec.calibrated_speedup = fit.speedup(b, kv_tokens / b)
            rec.fit = fit.record
        ref = self.reference(kv)
        if b == 1:
            self._reference_step(kv, mean_ctx, seconds)
        elif ref.covers(mean_ctx) and seconds > 0:
            rec.measured_speedup = b * ref.seconds_at(mean_ctx) / seconds
        if fit is not None and power is not None:
            # a modeled meter knows watts per batch; for a sensor the ledger fits them from this run
            m = self.ledger.marginal(b, lambda n: fit.step_seconds(n, n * kv_tokens / b), self.watts_at)
            if m is not None:
                rec.next_agent_joules_per_token = m.joules_per_token_next
                rec.modeled_joules_per_token = m.joules_per_token_now

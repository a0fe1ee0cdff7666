"""An experiment's verdicts: after each pair, kept, rejected, given up or another pair; whether the forecast
that proposed it agrees with what the swarm measured; and what its steps taught of a KV type.

With the step times' pairs (engine/tune/experiment.py) the candidate's model is scaled by what they measured
(each bound) and the rest of the run forecast again both ways: kept where even the unfavourable bound clears
the bar and the forecast's own error (the larger of the stated one and, where the steps measured as modeled,
how far the forecast again moved from the proposal's), rejected where even the favourable one falls short
of the bar. A cap or a residency is kept only where the objective's own pairs agree, and rejected where
they fall short at 95%. Without step pairs (no model yet), the objective's pairs alone decide."""

import math
import time

from swarmtune.engine.backends.sim_backend import StepScale
from swarmtune.engine.engine_view import EngineView
from swarmtune.engine.tune.experiment import MIN_PAIRS, Experiment
from swarmtune.engine.tune.forecast import Forecaster
from swarmtune.engine.tune.goal import Goal

MAX_BLOCK_EPOCHS = 2.0
# a forecast agrees with an experiment where the candidate's step times, relative to the incumbent's, are
# within this of what its model said (beyond the measured bounds): a 5% step-time error moves a forecast
# gain by about as much
AGREE_STEP = 0.05
# a closed pair is judged past the thinking budget where the verdict's forecasts cost at most this share of
# the pair they may save: a verdict put off runs another pair, half of it at the worse setting, its switches
# and churn (a 64 s run at 2 threads judged at 35-51 s what its third pair had measured by ~25 s, and each
# forecast cost ~20 ms there against pairs of 3-7 s)
VERDICT_SHARE = 0.1


class Judge:
    def __init__(self, goal: Goal, forecaster: Forecaster) -> None:
        self.goal = goal
        self.fc = forecaster  # the forecasts again on measured step times, and the thinking they cost

    def max_block_s(self, now: float) -> float:
        """A block longer than this (MAX_BLOCK_EPOCHS epochs, or a sixth of the horizon) costs more than an
        experiment could find."""
        return max(MAX_BLOCK_EPOCHS * self.goal.epoch_s, self.fc.horizon_at(now) / 6)

    def room_for_a_pair(self, engine: EngineView, x: Experiment) -> bool:
        """Another pair fits: its blocks at most max_block_s (a switch dearer than a quarter of that costs
        more than an experiment can find), and, in a run of known length, as long again left after it to
        reap what it finds."""
        if x.block_s > self.max_block_s(engine.now_s()):
            return False
        return self.goal.run_s is None or self.goal.run_s - engine.now_s() >= 2 * 2 * x.block_s

    def may_think(self, engine: EngineView, x: Experiment, forecasts: int) -> bool:
        """Within the thinking budget, or past it where `forecasts` forecasts, at what one has cost this run
        (measured; modeled on the sim), cost at most VERDICT_SHARE of the least a pair takes."""
        if not self.fc.thinking_spent(engine.now_s()):
            return True
        per_s = self.fc.cost.think_s / max(self.fc.cost.forecasts, 1)
        return forecasts * per_s <= VERDICT_SHARE * 2 * x.block_s

    def judge(self, engine: EngineView, x: Experiment) -> str | None:
        """kept | rejected | gave up, or None for another pair. (For a KV type the objective's pairs are no
        guard: one that holds more of the swarm in the budget spends its first blocks prefilling what it
        newly admits, and the other gives it back on the way out, so over blocks of a second or two they
        measure the budget's churn against the candidate, not the setting.)"""
        obj = x.result()
        if obj.pairs < MIN_PAIRS:
            return self.judge_early(engine, x)
        dec = x.step_factor("decode")
        short = obj.high is not None and math.log1p(obj.high) < x.bar  # the objective's pairs, measured short
        # a cap or a residency changes no step's cost, only what the swarm does with its steps: the model's
        # forecast of that is a forecast still (the sim's own model forecast +12.8% for a residency whose
        # pairs measured -47%), so the objective's own pairs must not say otherwise, centrally and at 95%
        kv_change = x.candidate.kv != x.incumbent.kv
        pairs_agree = kv_change or (obj.gain is not None and math.log1p(obj.gain) > x.bar and not short)
        if dec is None or x.model is None:
            if short:
                return "rejected"
            if obj.low is not None and math.log1p(obj.low) > x.bar:
                return "kept"
        elif self.may_think(engine, x, 3) or obj.pairs >= x.max_pairs:
            # a KV type's factor is put on attention (what grows with the contexts) where its pairs could tell
            # it apart; until then it is not kept on the whole step alone (which says too little of longer
            # contexts), but may be rejected or given up on it
            pre = x.step_factor("prefill") or (1.0, 1.0, 1.0)
            att = x.step_factor("attention") if kv_change else None

            def scale(k: int) -> StepScale:
                if att is not None:
                    return StepScale(prefill=pre[k], attention=att[k])
                return StepScale(decode=dec[k], prefill=pre[k])

            t0, c0, f0 = time.perf_counter(), time.thread_time(), self.fc.cost.forecasts
            try:
                unf = self.fc.corrected_gain(engine, x, scale(2)) if att is not None or not kv_change else None
                mid = self.fc.corrected_gain(engine, x, scale(0))
                # the forecast that turns measured step times into a gain has its own error (this run's checked
                # forecasts of staying, or how far it moved on steps its model had right): a gain kept on it
                # clears that too, not the bar alone
                need = x.bar + max(math.log1p(x.forecast_error), restated(x, mid))
                if unf is not None and unf > need and pairs_agree:
                    x.corrected = (unf, mid, None)
                    return "kept"
                fav = self.fc.corrected_gain(engine, x, scale(1))
                x.corrected = (unf, mid, fav)
                if (fav is not None and fav < x.bar) or (short and not kv_change):
                    return "rejected"
                # futile: a pair past the least, and even its central estimate short of what keeping needs;
                # more pairs would mostly cost the candidate's blocks (it stays where it was, as at its budget)
                if obj.pairs > MIN_PAIRS and (mid is None or mid <= need):
                    return "gave up"
            finally:
                self.fc.think(engine, t0, c0, self.fc.cost.forecasts - f0)
        return "gave up" if obj.pairs >= x.max_pairs else None

    def judge_early(self, engine: EngineView, x: Experiment) -> str | None:
        """On one or two pairs: "rejected" where, with the incumbent's own noise before the experiment for
        their spread, even the favourable bound falls short of the bar (as judge decides with three or more:
        on the step times forecast again for a KV type, on the objective's pairs for the others), else None.
        Nothing is kept on so few pairs."""
        obj = x.early_result()
        kv_change = x.candidate.kv != x.incumbent.kv
        if not kv_change or x.model is None:
            return "rejected" if obj is not None and obj.high is not None and math.log1p(obj.high) < x.bar else None
        dec = x.early_step_factor("decode")
        if dec is None or not self.may_think(engine, x, 1):
            return None
        pre = x.early_step_factor("prefill") or (1.0, 1.0, 1.0)
        t0, c0, f0 = time.perf_counter(), time.thread_time(), self.fc.cost.forecasts
        try:
            fav = self.fc.corrected_gain(engine, x, StepScale(decode=dec[1], prefill=pre[1]))
        finally:
            self.fc.think(engine, t0, c0, self.fc.cost.forecasts - f0)
        if fav is not None and fav < x.bar:
            x.corrected = (None, None, fav)
            return "rejected"
        return None


def restated(x: Experiment, mid: float | None) -> float:
    """How far the forecast again (mid, log) moved from the proposal's where the candidate's steps measured
    as its model said (forecast_verdict agrees): on the same step times the two forecasts differ only in the
    state they started from, so the move is the forecast's own error, here, now; 0 otherwise. (On the
    simulated RX 9070 XT whose bandwidth is 30% below its model, a cap 4 proposed at -5.9% was forecast
    again at +21.5% seven seconds later on step factors of 1.00, and kept against a stated error of 14%;
    static cap 4 ran 16% below cap 8 there.)"""
    if mid is None or x.forecast_gain is None or forecast_verdict(x) != "agrees":
        return 0.0
    return abs(mid - math.log1p(x.forecast_gain))


def forecast_verdict(x: Experiment) -> str | None:
    """Whether the forecast that proposed it agrees with what the swarm measured. With step pairs: the
    candidate's decode step times (a KV type's attention), relative to the incumbent's, as the model said
    (a factor of 1) within their measured 95% bounds widened by AGREE_STEP (what a forecast's gain may
    carry). Without: the forecast gain within the objective pairs' bounds. None with fewer pairs than a
    bound needs."""
    dec = x.step_factor("decode") or x.early_step_factor("decode")
    if x.candidate.kv != x.incumbent.kv and x.step_factor("attention") is not None:
        dec = x.step_factor("attention")  # a KV type's model differs from the truth in its attention
    if dec is not None and x.model is not None:
        _, low, high = dec
        return "agrees" if low / (1 + AGREE_STEP) <= 1.0 <= high * (1 + AGREE_STEP) else "disagrees"
    r = x.result()
    if r.pairs < MIN_PAIRS:
        r = x.early_result() or r  # one or two pairs: their spread the incumbent's noise, where measured
    if x.forecast_gain is None or (r.pairs < MIN_PAIRS and x.noise is None) or r.low is None or r.high is None:
        return None
    return "agrees" if r.low <= x.forecast_gain <= r.high else "disagrees"


def learned_scale(x: Experiment) -> StepScale | None:
    """What a KV type's steps measured in an experiment, to stand for the type in later forecasts: its central
    factors against the model unscaled (an experiment's frozen model is), relative to the incumbent's."""
    dec = x.step_factor("decode") or x.early_step_factor("decode")
    pre = x.step_factor("prefill") or x.early_step_factor("prefill")
    att = x.step_factor("attention")
    if x.candidate.kv == x.incumbent.kv or x.model is None or (att or dec) is None:
        return None
    return StepScale(decode=1.0 if att is not None or dec is None else dec[0], prefill=pre[0] if pre else 1.0,
                     attention=None if att is None else att[0])

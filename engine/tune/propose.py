"""Proposals: the neighbours of the live setting (one lever at a time, a step away), forecast, and the best
one made an experiment where its forecast gain clears the margin and the forecast's error, or, within that
error, while the exploration budget lasts. A setting an experiment did not keep is not proposed again until
the swarm has moved (its contexts, its KV budget, the shape of its turns)."""

import math
from dataclasses import replace

from swarmtune.engine.engine_view import EngineView
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.measure.budget_fill import ResidentGrowth
from swarmtune.engine.quality.quality_check import QualityLedger
from swarmtune.engine.record.records import StepRecord, mean_context
from swarmtune.engine.settings import RESIDENCY, cap_in_force, min_context
from swarmtune.engine.tune.budget_outlook import BudgetOutlook, outlook, quality_ruled_out
from swarmtune.engine.tune.events import Trial
from swarmtune.engine.tune.experiment import CONFIDENCE, MIN_PAIRS, Experiment
from swarmtune.engine.tune.forecast import Forecaster, Runs, gain
from swarmtune.engine.tune.goal import Goal, Setting
from swarmtune.engine.tune.outcome import ForecastChecks
from swarmtune.engine.tune.simulator import SimStepCost
from swarmtune.engine.tune.verdict import Judge

# contexts "moved 50%" from a setting tried with (nearly) empty caches means moved 50% of this many tokens
REVISIT_MIN_CONTEXT = 256.0
# a candidate an experiment did not keep (or a setting an experiment replaced) is proposed again only once
# the mean context moved this much since, or the budget or the turns' shape changed
RETRY_CONTEXT_CHANGE = 0.5
# a block lasts at least this many times what the switch into it is expected to cost: the switches' share of
# an experiment stays near an eighth (they fall on both sides alike, and are counted as the tuner's cost)
BLOCK_PER_SWITCH = 4.0
# a gain kept must clear what going over costs (one switch) over what is left of the run, plus this
TOLERANCE = 0.01


class Proposer:
    def __init__(self, goal: Goal, forecaster: Forecaster, checks: ForecastChecks, judge: Judge) -> None:
        self.goal = goal
        self.fc = forecaster
        self.checks = checks  # its forecasts of staying, checked: the error a proposal is judged against
        self.judge = judge  # how long a block may be
        # settings an experiment did not keep, or replaced: the mean context, KV budget and turns' shape then
        self.tried: dict[Setting, tuple[float, float | None, tuple[int, int]]] = {}
        # the last candidates' KV types the quality budget excluded, and their mean KL (None: not measured)
        self.excluded: dict[KVSetting, float | None] = {}
        self.outlook: BudgetOutlook | None = None  # the KV budget's, at the last proposal
        # the most the best candidate could gain at the last proposal, its forecast gain and error together
        # (-inf where none was forecast): at or below 0 nothing is within reach of an experiment
        self.reach: float | None = None

    def candidates(self, engine: EngineView, cur: Setting) -> list[Setting]:
        n = len(engine.agents)
        caps = sorted({max(1, cur.batch_cap // 2), cap_in_force(cur.batch_cap * 2, n), n} - {cur.batch_cap})
        kvs = [k for k in (self.goal.allowed_kv or (engine.s.kv,)) if k != cur.kv]
        out = [replace(cur, batch_cap=c) for c in caps]
        out += [replace(cur, kv=k) for k in kvs]
        out += [replace(cur, residency=r) for r in RESIDENCY if r != cur.residency]
        out = [c for c in out if c.kv not in self.fc.measured.refused]
        ctx = [a.context for a in engine.agents]
        mean_ctx = mean_context(ctx)
        self.excluded = {}
        if self.goal.kv_quality is not None and (ledger := quality_ledger(engine)) is not None:
            # under a quality budget only a setting measured within it at these contexts (the longest
            # history's band, where the check measures and where a KV type errs most)
            longest = max((len(a.history) for a in engine.agents), default=0)
            self.excluded = {c.kv: ledger.mean_kl(c.kv, longest) for c in out
                             if c.kv != cur.kv and not ledger.within(c.kv, longest, self.goal.kv_quality)}
            out = [c for c in out if c.kv not in self.excluded]
        out = [c for c in out if not self._retry_blocked(engine, c, mean_ctx)]
        if engine.s.kv_budget_bytes is not None:  # a type whose budget cannot hold one agent is no candidate
            out = [c for c in out if engine.budget_tokens(c.kv) >= min_context(engine.s)]
        return out

    def remember_tried(self, engine: EngineView, s: Setting) -> None:
        """s was left (not kept, or replaced): not proposed again until the swarm moves."""
        self.tried[s] = (mean_context([a.context for a in engine.agents]), engine.s.kv_budget_bytes,
                         turn_shape(engine))

    def propose(self, engine: EngineView, cur: Setting, base: Runs, kv_only: bool, explored_s: float,
                steps_at_cur: list[StepRecord], probe_pending: bool = False,
                growth: ResidentGrowth | None = None) -> tuple[Experiment, Trial] | None:
        """The neighbour the forecasts rank best, as an experiment and its record; None where none is worth
        one. kv_only: only the KV types; explored_s: what exploratory experiments (and probes) took so far;
        probe_pending: a probe by conversion is still to come (no exploration before it); steps_at_cur: the
        incumbent's last steps, whose noise the experiment starts with; growth: the resident histories' (the
        KV budget's outlook, `self.outlook`, is weighed where one is given)."""
        n = len(engine.agents)
        now = engine.now_s()
        mean_ctx = mean_context([a.context for a in engine.agents])
        self.reach = -math.inf  # nothing forecast: no move could gain
        # only what an experiment could try and reap in what is left: a forecast of the rest is thinking spent
        # on a move that could never be made
        candidates = [c for c in self.candidates(engine, cur)
                      if (not kv_only or c.kv != cur.kv) and self.can_try(engine, cur, c, now)]
        forecasts = {c: f for c in candidates if (f := self.fc.forecast(engine, c)) is not None}
        horizon = self.fc.horizon_at(now)
        self.outlook = None if growth is None else self._outlook(engine, cur, base, forecasts, growth, horizon)
        if not forecasts:
            return None

        def score(runs: Runs) -> float:
            return sum(run[-1].score(self.goal, n) for run in runs) / len(runs)

        base_score = score(base)
        ranked = sorted(((g, c) for c in forecasts if (g := gain(score(forecasts[c]), base_score)) is not None),
                        key=lambda x: -x[0])
        if not ranked:
            return None
        g, best = ranked[0]
        span = len(self.fc.spans_for(horizon)) - 1
        error = self.checks.forecast_error(span, self.goal.prior_error)
        per_seed = [gain(h[-1].score(self.goal, n), b[-1].score(self.goal, n))
                    for h, b in zip(forecasts[best], base, strict=True)]
        spread = _spread(per_seed) or 0.0
        # a KV type never timed on this machine is forecast on another type's step times and its bytes: how
        # far off that is, nothing here has measured (q8_0 forecast +22-38% ran 30% slower on an AVX2 EPYC),
        # so its gain is within an error of unknown size: an experiment only from the exploration budget
        untimed = best.kv != cur.kv and not self.timed(engine, best.kv)
        # a KV type timed only by its side-cache probe is forecast on step times that may be off by as much as
        # the probe's own steps spread (each point a median of 3; the same probe of q8_0 on a 2-core AVX2 EPYC
        # gave its attention 2.52x, 0.25x and 0.58x f16's in three runs), and a gain by about as much
        # (verdict.py's AGREE_STEP): where that is the larger error, the forecast is judged against it
        probed = None if best.kv == cur.kv or best.kv in self.fc.measured_scale else \
            self.fc.measured.probe_error(engine, best.kv)
        stated = error
        if probed is not None and probed[0] > error:
            error = probed[0]
        self.reach = g + error
        exploratory = untimed or g < self.goal.margin + max(spread, error)
        if exploratory and g <= -error:
            return None  # forecast worse past its own error: not worth an experiment
        block_s = self.block_s(engine, cur, best)
        if block_s > self.judge.max_block_s(now):
            return None  # a switch this dear costs more than an experiment could find
        left_s = math.inf if self.goal.run_s is None else self.goal.run_s - now
        # what an experiment needs: its least pairs, and as long again to reap what it finds
        least_s = 2 * MIN_PAIRS * 2 * block_s
        if left_s < least_s:
            return None
        # at most a third of what is left of a run of known length: the rest is to reap what it finds
        max_pairs = self.goal.max_pairs if left_s == math.inf else min(
            self.goal.max_pairs, max(MIN_PAIRS, int((left_s / 3) / (2 * block_s))))
        explore: tuple[float, float, float] | None = None
        if exploratory and probe_pending:
            # a KV type is about to be timed on the swarm's own history (engine/tune/tuner.py): an exploration
            # now would hold the probe off (it waits for no experiment) and spend the budget it needs
            return None
        if exploratory:
            # an experiment the forecast cannot back: only while exploring has taken at most explore_share of
            # the run (of the horizon where the run's length is unknown), counting an experiment at its least
            # pairs on both sides and as long again to reap. (Counting only what a candidate rejected at its
            # first pair costs let a 64 s run try q8_0 on the default model, on a 2-core AVX2 EPYC: at 1
            # thread it kept it, 1.54x its start, and at 2 threads it gave up after 4 pairs and the run lost
            # 6.5% against 3% counted, measured: docs/tuner.md, 2026-12-04.)
            whole = self.goal.run_s if self.goal.run_s is not None else max(now, self.goal.horizon_s)
            explore = (explored_s, least_s, self.goal.explore_share * whole)
            if explored_s + least_s > explore[2]:
                return None
        remaining = min(left_s, self.goal.horizon_s) - 2 * max_pairs * block_s
        bar = TOLERANCE + self.switch_s(engine, cur, best) / max(remaining, block_s)
        sim = self.fc.simulator(engine)
        x = Experiment(incumbent=cur, candidate=best, goal=self.goal, n_agents=n, block_s=block_s,
                       max_pairs=max_pairs, bar=bar, forecast_gain=g, forecast_error=stated,
                       exploratory=exploratory, model=None if sim is None else SimStepCost(sim))
        noise = x.measure_noise(steps_at_cur)
        budget = f"{self.outlook.head()}; " if self.outlook is not None and self.outlook.binds() else ""
        why = (budget + f"tune trial: {what(cur, best)}: forecast {g:+.1%} {self.goal.objective} over {horizon:.0f} s "
               "(modeled), "
               + ("on a KV type never timed here: an experiment" if untimed else
                  f"within its error ±{error:.0%}: an experiment" if exploratory
                  else f"past its error ±{error:.0%} and the margin")
               + ("" if probed is None or error == stated else
                  f" (its side-cache probe's spread: a step at {probed[1]:,.0f} tokens may be off by that, measured)")
               + ("" if explore is None else
                  f" from the exploration budget (explorations took {explore[0]:.1f} s of its {explore[2]:.1f} s; "
                  f"this one at least {explore[1]:.1f} s)")
               + f"; tried against {cur.label()} in interleaved blocks of {block_s:.1f} s, kept only if "
                 f"{MIN_PAIRS}-{max_pairs} pairs measure it past {bar:+.1%} at {CONFIDENCE:.0%}"
               + ("" if noise is None else
                  f"; rejected from its first pair where it falls short by more than the incumbent's own "
                  f"block-to-block noise (±{noise.sd['objective'][0]:.1%} over {noise.sd['objective'][1]} "
                  "differences, measured)"))
        return x, Trial(from_=cur, to=best, objective=self.goal.objective, forecast_gain=round(g, 4),
                        forecast_gain_source="modeled", forecast_error=round(error, 4),
                        forecast_error_source=self.checks.error_source(span) if error == stated else
                        "measured: the spread of its KV type's side-cache probe",
                        exploratory=exploratory, block_s=round(block_s, 3), max_pairs=max_pairs,
                        bar=round(bar, 4), mean_context=round(mean_ctx, 1), why=why,
                        explored_s=None if explore is None else round(explore[0], 3),
                        explore_least_s=None if explore is None else round(explore[1], 3),
                        explore_budget_s=None if explore is None else round(explore[2], 3))

    def _outlook(self, engine: EngineView, cur: Setting, base: Runs, forecasts: dict[Setting, Runs],
                 growth: ResidentGrowth, horizon_s: float) -> BudgetOutlook | None:
        """The KV budget's outlook from this look's forecasts: staying's churn and each way out's."""
        ledger = quality_ledger(engine)
        longest = max((len(a.history) for a in engine.agents), default=0)
        kl = {c.kv: ledger.mean_kl(c.kv, longest) if ledger is not None else None for c in forecasts}
        allowed = [k for k in (self.goal.allowed_kv or ()) if k not in self.fc.measured.refused]
        return outlook(engine, cur, base, forecasts, growth, self.goal, horizon_s, kl,
                       quality_ruled_out(engine, cur, self.goal, self.excluded, allowed))

    def can_try(self, engine: EngineView, cur: Setting, c: Setting, now: float) -> bool:
        """An experiment on c could run in what is left of the run and be reaped: its least pairs of blocks,
        each as long as switching there and back asks (engine/tune/measured.py: a new context and the cells
        converted), and as long again; and its blocks no longer than a verdict allows."""
        block_s = self.block_s(engine, cur, c)
        left_s = math.inf if self.goal.run_s is None else self.goal.run_s - now
        return block_s <= self.judge.max_block_s(now) and 2 * MIN_PAIRS * 2 * block_s <= left_s

    def timed(self, engine: EngineView, kv: KVSetting) -> bool:
        """This machine's step times at a KV type are known: the sim's card states them; on a real backend a
        fit of its own steps, a probe in a side cache, or what an experiment measured of it."""
        if engine.backend.source == "simulated" or kv in self.fc.measured_scale:
            return True
        return not self.fc.measured.step_time_source(engine, kv).startswith("borrowed")

    def switch_s(self, engine: EngineView, a: Setting, b: Setting) -> float:
        return 0.0 if a.kv == b.kv else self.fc.measured.switch_s(engine, a.kv)

    def block_s(self, engine: EngineView, a: Setting, b: Setting) -> float:
        """A block's least length: Goal.block_s, or BLOCK_PER_SWITCH switches' worth where switching costs
        (a KV switch while the budget holds agents out admits or evicts them again, and that prefill is the
        switch's too: engine/tune/measured.py's readmit_s); for a residency move, at least a tool wait.
        Residency acts when an agent leaves for a tool (its history swapped out, or kept) and when it comes
        back (swapped in, or found): in a block shorter than a wait the one falls in one side's block and
        the other in the other's, so a pair measures neither
        (on the simulated RX 9070 XT, 1 s blocks against 5 s waits measured swap at -67% to +320% of keep,
        and the swarm kept it on that: docs/tuner.md)."""
        least = max(self.goal.block_s, BLOCK_PER_SWITCH * (self.switch_s(engine, a, b)
                                                            + self.fc.measured.readmit_s(engine, a.kv, b.kv)))
        if a.residency != b.residency:
            least = max(least, engine.s.tool_latency_s)
        return least

    def _retry_blocked(self, engine: EngineView, s: Setting, mean_ctx: float) -> bool:
        """A setting an experiment did not keep (or replaced), under conditions that have not moved since: the
        contexts, the budget and the turns' shape."""
        p = self.tried.get(s)
        if p is None:
            return False
        ctx, budget, shape = p
        moved = abs(mean_ctx - ctx) >= RETRY_CONTEXT_CHANGE * max(ctx, REVISIT_MIN_CONTEXT)
        return not moved and budget == engine.s.kv_budget_bytes and shape == turn_shape(engine)


def quality_ledger(engine: EngineView) -> QualityLedger | None:
    """The live quality check's ledger (engine/quality/quality_check.py), where the engine has one."""
    ledger = getattr(engine.quality, "ledger", None)
    return ledger if isinstance(ledger, QualityLedger) else None


def _spread(gains: list[float | None]) -> float | None:
    """Half the range of per-draw gains; None if any is missing or not finite."""
    vals = [g for g in gains if g is not None and math.isfinite(g)]
    if not gains or len(vals) < len(gains):
        return None
    return (max(vals) - min(vals)) / 2


def what(a: Setting, b: Setting) -> str:
    return ", ".join(f"{k} {getattr(a, k)} -> {getattr(b, k)}" for k in ("batch_cap", "kv", "residency")
                     if getattr(a, k) != getattr(b, k))


def turn_shape(engine: EngineView) -> tuple[int, int]:
    """What a turn generates and what its tool result adds: the workload's shape, which the forecasts take
    from the engine's settings, and which can change while the swarm runs."""
    return engine.s.gen_tokens, engine.s.tool_tokens

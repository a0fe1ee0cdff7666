"""The auto-tuner: holds a running swarm at its best setting (batch cap, KV type, residency) as it moves.

A forecast proposes; the swarm decides. At the end of each epoch the tuner forecasts the next
`horizon_s` seconds from the swarm's present state under the current setting and each neighbour, by
running the workload forward in a simulator (the sim profile as stated on the sim backend; on a real one
a simulator calibrated on this run's own steps, engine/tune/simulator.py). The best neighbour, where its
forecast gain clears the margin and the forecast's error, or lies within that error while the exploration
budget lasts, is then tried on the live swarm against the setting it would replace: the two take turns
in short interleaved blocks, and it is kept only where the measured pairs say, at one-sided 95%, that it
gains more than going over costs; shown not to, or still undecided when its budget of pairs is spent, the
swarm stays where it was (engine/tune/experiment.py). So a model that is wrong on this machine (a KV
type's cost, a card's bandwidth) can waste an experiment, never hold the swarm at a worse setting.

Forecasts of staying are checked against what came, span by span: their rms error is the error a
proposal is judged against. Everything the tuner spends is counted (engine/tune/cost.py): its thinking,
which runs on the engine's own thread and is held to `think_share` of the run, its probes, its switches'
seconds and cells, and the tokens its experiments cost.

Forecasts draw tool latencies from their own stream: the tuner does not know the future.
"""

import math
import time
from collections import deque
from dataclasses import replace

from swarmtune.engine.control import Control
from swarmtune.engine.engine import Engine  # the engine takes a tuner as a value; it never imports this package
from swarmtune.engine.errors import Stalled, UserError
from swarmtune.engine.kv_quality import REFERENCE as QUALITY_REFERENCE
from swarmtune.engine.power.meter import ModeledMeter, NoMeter
from swarmtune.engine.records import StepRecord, mean_context
from swarmtune.engine.settings import RESIDENCY, cap_in_force, min_context
from swarmtune.engine.sim_backend import SimBackend, StepScale
from swarmtune.engine.tune.cost import Spending
from swarmtune.engine.tune.experiment import CONFIDENCE, MIN_PAIRS, Experiment
from swarmtune.engine.tune.goal import Goal, Setting
from swarmtune.engine.tune.measured import MIN_OWN_FIT_SAMPLES, Measured
from swarmtune.engine.tune.outcome import ForecastChecks
from swarmtune.engine.tune.shadow import shadow_of
from swarmtune.engine.tune.simulator import SimStepCost
from swarmtune.engine.tune.tally import SpanTally, Tally
from swarmtune.engine.tune_events import Decision, Experimented, Spent, Trial, TuneEvent

FORECAST_SEED_SALT = 7919  # the forecast's tool latencies come from another stream than the run's
YIELD_EVERY_STEPS = 64  # how often a forecast looks whether a pause wants the engine thread
# contexts "moved 50%" from a setting tried with (nearly) empty caches means moved 50% of this many tokens
REVISIT_MIN_CONTEXT = 256.0
# a candidate an experiment did not keep (or a setting an experiment replaced) is proposed again only once
# the mean context moved this much since, or the budget or the turns' shape changed
RETRY_CONTEXT_CHANGE = 0.5
PROBE_MIN_RUN_S = 600.0  # a run this long or longer (or of unknown length) times its KV types in a side cache
# a block lasts at least this many times what the switch into it is expected to cost: the switches' share of
# an experiment stays near an eighth (they fall on both sides alike, and are counted as the tuner's cost)
BLOCK_PER_SWITCH = 4.0
MAX_BLOCK_EPOCHS = 2.0
# a gain kept must clear what going over costs (one switch) over what is left of the run, plus this
TOLERANCE = 0.01
# a forecast agrees with an experiment where the candidate's step times, relative to the incumbent's, are
# within this of what its model said (beyond the measured bounds): a 5% step-time error moves a forecast
# gain by about as much
AGREE_STEP = 0.05
# the incumbent's steps before an experiment that measure the run's noise (engine seconds): enough blocks
# for a few differences, not so long ago that the swarm was another
NOISE_WINDOW_S = 40.0


class Tuner:
    def __init__(self, goal: Goal) -> None:
        self.goal = goal
        # what it learned of this machine, kept across a restart
        self.measured = Measured()
        self.checks = ForecastChecks()  # its forecasts of staying, checked: its stated error
        # settings an experiment did not keep, or replaced: the mean context, KV budget and turns' shape then
        self._tried: dict[Setting, tuple[float, float | None, tuple[int, int]]] = {}
        # per KV type, what an experiment measured of its steps against the model: later forecasts run on it
        # (until, on a real backend, the type has a fit of its own steps)
        self._measured_scale: dict[str, StepScale] = {}
        self.cost = Spending()
        self.restart()

    def restart(self) -> None:
        """Forget what it was measuring (turned on, or on again): it starts a fresh epoch."""
        self._epoch_start_s: float | None = None
        self._looked = False
        self._young_look = False  # the last look changed nothing, on a fit of fewer than MIN_OWN_FIT_SAMPLES steps
        self.checks.restart()
        self._exp: Experiment | None = None
        self._switching = False  # a KV switch asked for: its rebuild record is the tuner's cost
        self._explored_s = 0.0  # engine seconds of exploratory experiments (both sides' blocks)
        # the last NOISE_WINDOW_S of steps and the setting each ran at: the noise an experiment starts with
        self._recent: deque[tuple[StepRecord, Setting]] = deque()

    # what the engine calls after every record
    def observe(self, engine: Engine, rec: StepRecord) -> list[TuneEvent]:
        out: list[TuneEvent] = []
        now = engine.now_s()
        if self._epoch_start_s is None:
            self._epoch_start_s = now
        self.measured.learn(rec)
        self._account(rec)
        self._remember(rec, self.setting(engine))
        if not self._looked and engine.backend.source != "simulated" and self.probes_pay():
            # before the first look, whose forecasts need every allowed type's step time: measuring, not
            # forecasting (its seconds are the tuner's probe cost), once per type and run
            out += self._probe_missing(engine, self.setting(engine))
        out += self._quality_guard(engine)
        self.checks.drop_moved(self.setting(engine))
        self.checks.observe(rec, self.goal)
        if self._exp is not None:
            return out + self._experiment_step(engine, rec)
        first_look = not self._looked and self._simulator(engine) is not None
        if rec.kind == "rebuild" or (now - self._epoch_start_s < self.goal.epoch_s and not first_look
                                     and not self._fit_matured(engine)):
            return out
        return out + self._look(engine, now)

    def _account(self, rec: StepRecord) -> None:
        """A rebuild the tuner asked for is its cost: its seconds and the cells it converted or prefilled."""
        if rec.kind != "rebuild" or not self._switching:
            return
        self._switching = False
        seconds = rec.seconds + rec.residency_seconds
        cells = rec.converted_tokens + rec.tokens
        self.cost.switch_s += seconds
        self.cost.switch_cells += cells
        if self._exp is not None:
            self._exp.switch_s += seconds
            self._exp.switch_cells += cells
            # the blocks grow with what a switch measured: its share of the experiment stays small (up to
            # MAX_BLOCK_EPOCHS epochs: a switch dearer than that makes the experiment give up, below)
            self._exp.block_s = max(self._exp.block_s, BLOCK_PER_SWITCH * seconds)
        if cells:
            self.measured.switched(float(cells), seconds)

    def _quality_guard(self, engine: Engine) -> list[TuneEvent]:
        """Under a quality budget, the live KV setting measured past it (its KL grows with the contexts) is
        left at once for the reference (f16), and said why; an experiment under way is abandoned."""
        budget = self.goal.kv_quality
        ledger = _ledger(engine)
        if budget is None or ledger is None or self._switching:
            return []
        live = self.setting(engine)
        longest = max((len(a.history) for a in engine.agents), default=0)
        kl = ledger.mean_kl(live.kv, longest)
        if kl is None or kl <= budget or live.kv == QUALITY_REFERENCE:
            return []
        to = replace(live, kv=QUALITY_REFERENCE)
        if self._exp is not None:
            self._exp = None  # its candidate or its incumbent crossed the budget: nothing it measures counts
        if not self._move(engine, live, to):
            return []
        self._tried[live] = (mean_context([a.context for a in engine.agents]), engine.s.kv_budget_bytes,
                             turn_shape(engine))
        f = ledger.figure(live.kv, longest)
        band = f"{f.band[0]}-{f.band[1]}" if f is not None else "these"
        return [Decision(
            from_=live, to=to, objective="kv_quality", predicted_gain=0.0, predicted_gain_source="n/a",
            trial=False, forecast_spread=None, horizon_s=0.0,
            mean_context=round(mean_context([a.context for a in engine.agents]), 1), forecast_error=0.0,
            forecast_error_source="n/a: a quality budget, measured", kv_step_time_source=None,
            why=f"tune: KV {live.kv} measured mean KL {kl:.4f} nats at contexts {band}, past the quality budget "
                f"{budget:g}: back to {QUALITY_REFERENCE} (measured)")]

    def _remember(self, rec: StepRecord, setting: Setting) -> None:
        self._recent.append((rec, setting))
        while self._recent and self._recent[0][0].t < rec.t - NOISE_WINDOW_S:
            self._recent.popleft()

    def _steps_at(self, setting: Setting) -> list[StepRecord]:
        """The last steps, oldest first, since the setting last moved to this one (no rebuild among them)."""
        out: list[StepRecord] = []
        for rec, s in reversed(self._recent):
            if s != setting or rec.kind == "rebuild":
                break
            out.append(rec)
        return out[::-1]

    def _fit_matured(self, engine: Engine) -> bool:
        """A first look that changed nothing was made on a fit of a few steps (a real backend's model of this
        machine is its own steps): once that fit has MIN_OWN_FIT_SAMPLES, it looks again rather than an epoch
        later."""
        if not self._young_look:
            return False
        fit = engine.analysis.fit(engine.s.kv)
        return fit is not None and fit.samples >= MIN_OWN_FIT_SAMPLES

    def probes_pay(self) -> bool:
        """A side-cache probe costs 3-8 s of the swarm's time on these 2-core CPUs (two prefilled histories
        per type): worth it in a run of unknown length (the dashboard, serve) or a long one, not in a short
        one, where an experiment on the swarm itself measures the type where it matters."""
        return self.goal.run_s is None or self.goal.run_s >= PROBE_MIN_RUN_S

    def prepare(self, engine: Engine) -> list[TuneEvent]:
        """At the run's start, before its first step (a real backend): time the allowed KV types in a side
        cache, then take the first look at once (an experiment's first block begins with the first step)."""
        if engine.backend.source == "simulated" or self._looked:
            return []
        if self._epoch_start_s is None:
            self._epoch_start_s = engine.now_s()
        if not self.probes_pay():
            return []
        out = self._probe_missing(engine, self.setting(engine))
        if self._simulator(engine) is not None:
            out += self._look(engine, engine.now_s(), kv_only=True)
        return out

    # thinking
    def _thinking_spent(self, now: float) -> bool:
        """It has thought enough for now: the engine's thread is the swarm's. An average over the run with an
        epoch's credit (one look early in a run would otherwise skip the next three)."""
        return self.cost.think_s > self.goal.think_share * (max(now, 1.0) + self.goal.epoch_s)

    def _look(self, engine: Engine, now: float, kv_only: bool = False) -> list[TuneEvent]:
        """Forecast staying (checked later against what comes) and propose: an experiment, or nothing.
        kv_only: weigh only the KV types (a look before the first step)."""
        self._looked = True
        self._epoch_start_s = now
        self._young_look = False
        if self._thinking_spent(now):
            self.cost.looks_skipped += 1
            return []
        if self.goal.run_s is not None and self.goal.run_s - now < max(
                self.goal.epoch_s, 2 * MIN_PAIRS * 2 * self.goal.block_s):
            # less than an epoch left, or than the shortest experiment and as long again to reap it: nothing
            # could be tried, and a forecast of staying would serve no later proposal
            return []
        self.cost.looks += 1
        cur = self.setting(engine)
        t0, c0 = time.perf_counter(), time.thread_time()
        forecasts_before = self.cost.forecasts
        base = self.forecast(engine, cur)  # every epoch: the forecast of staying, checked as it unfolds
        out: list[TuneEvent] = []
        if base is not None and all(run[-1].seconds > 0 for run in base):
            self.checks.add(self._objectives(base), SpanTally(now, self.spans_for(self.horizon_at(now))), cur)
            trial = self._propose(engine, cur, base, kv_only)
            if trial is not None:
                out.append(trial)
        self._think(engine, t0, c0, self.cost.forecasts - forecasts_before)
        if engine.should_yield():  # a pause came mid-look: what it forecast is partial, so nothing is tried
            return []
        if not out and engine.backend.source != "simulated":
            fit = engine.analysis.fit(cur.kv)
            self._young_look = fit is None or fit.samples < MIN_OWN_FIT_SAMPLES
        return out

    def _think(self, engine: Engine, t0: float, c0: float, forecasts: int) -> None:
        """What a look's forecasts held the swarm up: wall seconds on a real backend (measured); on the sim,
        whose clock does not wait for them, Goal.sim_think_s per forecast (modeled)."""
        self.cost.think_cpu_s += time.thread_time() - c0
        if engine.backend.source == "simulated":
            self.cost.think_s += self.goal.sim_think_s * forecasts
        else:
            self.cost.think_s += time.perf_counter() - t0

    def horizon_at(self, now_s: float) -> float:
        """How far a forecast made now runs: what is left of a run of known length (up to the default
        horizon), else the default; at least one epoch."""
        h = self.goal.horizon_s
        if self.goal.run_s is not None:
            h = min(h, self.goal.run_s - now_s)
        return max(h, self.goal.epoch_s)

    def spans_for(self, horizon_s: float) -> list[float]:
        """The spans a forecast is checked over: each epoch up to the horizon (span k is always k+1 epochs,
        the last one cut at the horizon)."""
        n = max(1, math.ceil(horizon_s / self.goal.epoch_s - 1e-9))
        return [min(self.goal.epoch_s * (k + 1), horizon_s) for k in range(n)]

    @property
    def spans(self) -> list[float]:
        """The spans of a forecast over the default horizon."""
        return self.spans_for(self.goal.horizon_s)

    def _objectives(self, runs: list[list[Tally]]) -> list[float | None]:
        """The forecast objective at each span, averaged over the forecast's seeds."""
        return [_mean(run[k].objective_value(self.goal) for run in runs) for k in range(len(runs[0]))]

    def stated_error(self, span: int | None = None) -> float | None:
        """The stated error over a span (engine/tune/outcome.py); by default the default horizon's last."""
        return self.checks.stated_error(len(self.spans) - 1 if span is None else span)

    def forecast_error(self, span: int) -> float:
        return self.checks.forecast_error(span, self.goal.prior_error)

    def _error_source(self, span: int) -> str:
        return self.checks.error_source(span)

    @staticmethod
    def setting(engine: Engine) -> Setting:
        st = engine.state()
        return Setting(st.batch_cap, st.kv, st.residency)

    # the candidates: one lever at a time, a step away
    def candidates(self, engine: Engine, cur: Setting) -> list[Setting]:
        n = len(engine.agents)
        caps = sorted({max(1, cur.batch_cap // 2), cap_in_force(cur.batch_cap * 2, n), n} - {cur.batch_cap})
        kvs = [k for k in (self.goal.allowed_kv or (engine.s.kv,)) if k != cur.kv]
        out = [replace(cur, batch_cap=c) for c in caps]
        out += [replace(cur, kv=k) for k in kvs]
        out += [replace(cur, residency=r) for r in RESIDENCY if r != cur.residency]
        out = [c for c in out if c.kv not in engine.refused_kv]
        ctx = [a.context for a in engine.agents]
        mean_ctx = mean_context(ctx)
        if self.goal.kv_quality is not None and (ledger := _ledger(engine)) is not None:
            # under a quality budget only a setting measured within it at these contexts (the longest
            # history's band, where the check measures and where a KV type errs most)
            longest = max((len(a.history) for a in engine.agents), default=0)
            out = [c for c in out if c.kv == cur.kv or ledger.within(c.kv, longest, self.goal.kv_quality)]
        out = [c for c in out if not self._retry_blocked(engine, c, mean_ctx)]
        if engine.s.kv_budget_bytes is not None:  # a type whose budget cannot hold one agent is no candidate
            out = [c for c in out if engine.budget_tokens(c.kv) >= min_context(engine.s)]
        return out

    def forecast(self, engine: Engine, setting: Setting, seeds: range | None = None,
                 scale: dict[str, StepScale] | None = None) -> list[list[Tally]] | None:
        """One run forward per forecast seed (common to every candidate, so they differ by the setting and
        not by luck); None if any of them could not run."""
        # one start for every seed: on a real backend the clock moves while they run, and a horizon cut at a
        # run's end must give each the same spans (they are averaged span by span)
        start = engine.now_s()
        runs = [self._forecast_once(engine, setting, k, start, scale)
                for k in (seeds or range(self.goal.forecast_seeds))]
        self.cost.forecasts += len(runs)
        done = [r for r in runs if r is not None]
        return None if len(done) < len(runs) else done

    def _forecast_once(self, engine: Engine, setting: Setting, k: int, start: float,
                       scale: dict[str, StepScale] | None = None) -> list[Tally] | None:
        """Run the swarm forward from now under `setting` in a simulator: what each span up to the horizon
        would hold (the last is the whole horizon); None where the simulator cannot run the swarm that way."""
        sim = self._simulator(engine)
        if sim is None:
            return None
        sim.scale = {**self._learned_scale(engine), **(scale or {})}
        s = replace(engine.s, batch_cap=cap_in_force(setting.batch_cap, len(engine.agents)),
                    residency=setting.residency,
                    check=False, seed=engine.s.seed + FORECAST_SEED_SALT * (k + 1),
                    agents=len(engine.agents))
        shadow = shadow_of(engine, sim, s, meter=self._meter(engine))
        if setting.kv != engine.s.kv:
            try:
                shadow.request(Control(kv=setting.kv))
            except UserError:  # the budget holds too little at that type
                return None
        horizon = self.horizon_at(start)
        tally = SpanTally(start, self.spans_for(horizon))
        end = start + horizon
        steps = 0
        while shadow.now_s() < end and steps < 200_000:
            if steps % YIELD_EVERY_STEPS == 0 and engine.should_yield():
                return None  # a pause answers once the step in flight ends: this look is given up
            try:
                r = shadow.step()
            except (Stalled, UserError):  # the budget cannot run the swarm this way: not a candidate (a
                # CacheMismatch, the engine's own bug, is not caught: it fails the run that met it)
                return None
            tally.add(r)
            steps += 1
        return tally.finish()

    def _simulator(self, engine: Engine) -> SimBackend | None:
        return self.measured.simulator(engine)

    def step_time_source(self, engine: Engine, kv: str) -> str:
        return self.measured.step_time_source(engine, kv)

    def _probe_missing(self, engine: Engine, cur: Setting) -> list[TuneEvent]:
        kvs = {c.kv for c in self.candidates(engine, cur)} - {cur.kv}
        return self.measured.probe_missing(engine, cur.kv, kvs, self.cost)

    def _meter(self, engine: Engine):
        m = engine.meter
        if isinstance(m, ModeledMeter):
            return ModeledMeter(m.floor_watts, m.per_agent_watts)
        return NoMeter("forecast: no power model")

    # proposing an experiment
    def _propose(self, engine: Engine, cur: Setting, base: list[list[Tally]], kv_only: bool) -> Trial | None:
        """The neighbour the forecasts rank best, tried on the swarm where its forecast gain clears the margin
        and the forecast's error, or, within that error, where the exploration budget allows."""
        n = len(engine.agents)
        now = engine.now_s()
        mean_ctx = mean_context([a.context for a in engine.agents])
        candidates = [c for c in self.candidates(engine, cur) if not kv_only or c.kv != cur.kv]
        forecasts = {c: f for c in candidates if (f := self.forecast(engine, c)) is not None}
        if not forecasts:
            return None

        def score(runs: list[list[Tally]]) -> float:
            return sum(run[-1].score(self.goal, n) for run in runs) / len(runs)

        base_score = score(base)
        ranked = sorted(((g, c) for c in forecasts if (g := _gain(score(forecasts[c]), base_score)) is not None),
                        key=lambda x: -x[0])
        if not ranked:
            return None
        gain, best = ranked[0]
        horizon = self.horizon_at(now)
        error = self.forecast_error(len(self.spans_for(horizon)) - 1)
        per_seed = [_gain(h[-1].score(self.goal, n), b[-1].score(self.goal, n))
                    for h, b in zip(forecasts[best], base, strict=True)]
        spread = _spread(per_seed) or 0.0
        # a KV type never timed on this machine is forecast on another type's step times and its bytes: how
        # far off that is, nothing here has measured (q8_0 forecast +22-38% ran 30% slower on an AVX2 EPYC),
        # so its gain is within an error of unknown size: an experiment only from the exploration budget
        untimed = best.kv != cur.kv and not self._timed(engine, best.kv)
        exploratory = untimed or gain < self.goal.margin + max(spread, error)
        if exploratory and gain <= -error:
            return None  # forecast worse past its own error: not worth an experiment
        block_s = self._block_s(engine, cur, best)
        if block_s > self._max_block_s(now):
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
        if exploratory:
            # an experiment the forecast cannot back: only while exploring has taken at most explore_share of
            # the run (of the horizon where the run's length is unknown), counting an experiment at its least
            # pairs on both sides and as long again to reap. (Counting only what a candidate rejected at its
            # first pair costs let a 64 s run try q8_0 on the default model, on a 2-core AVX2 EPYC: at 1
            # thread it kept it, 1.54x its start, and at 2 threads it gave up after 4 pairs and the run lost
            # 6.5% against 3% counted, measured: docs/tuner.md, 2026-12-04.)
            whole = self.goal.run_s if self.goal.run_s is not None else max(now, self.goal.horizon_s)
            least = 2 * MIN_PAIRS * 2 * block_s
            explore = (self._explored_s, least, self.goal.explore_share * whole)
            if self._explored_s + least > explore[2]:
                return None
        remaining = min(left_s, self.goal.horizon_s) - 2 * max_pairs * block_s
        bar = TOLERANCE + self._switch_s(engine, cur, best) / max(remaining, block_s)
        sim = self._simulator(engine)
        self._exp = Experiment(incumbent=cur, candidate=best, goal=self.goal, n_agents=n, block_s=block_s,
                               max_pairs=max_pairs, bar=bar, forecast_gain=gain, forecast_error=error,
                               exploratory=exploratory,
                               model=None if sim is None else SimStepCost(sim))
        noise = self._exp.measure_noise(self._steps_at(cur))
        self.cost.experiments += 1
        what = _what(cur, best)
        why = (f"tune trial: {what}: forecast {gain:+.1%} {self.goal.objective} over {horizon:.0f} s (modeled), "
               + ("on a KV type never timed here: an experiment" if untimed else
                  f"within its error ±{error:.0%}: an experiment" if exploratory
                  else f"past its error ±{error:.0%} and the margin")
               + ("" if explore is None else
                  f" from the exploration budget (explorations took {explore[0]:.1f} s of its {explore[2]:.1f} s; "
                  f"this one at least {explore[1]:.1f} s)")
               + f"; tried against {cur.label()} in interleaved blocks of {block_s:.1f} s, kept only if "
                 f"{MIN_PAIRS}-{max_pairs} pairs measure it past {bar:+.1%} at {CONFIDENCE:.0%}"
               + ("" if noise is None else
                  f"; rejected from its first pair where it falls short by more than the incumbent's own "
                  f"block-to-block noise (±{noise.sd['objective'][0]:.1%} over {noise.sd['objective'][1]} "
                  "differences, measured)"))
        return Trial(from_=cur, to=best, objective=self.goal.objective, forecast_gain=round(gain, 4),
                     forecast_gain_source="modeled", forecast_error=round(error, 4),
                     forecast_error_source=self._error_source(len(self.spans_for(horizon)) - 1),
                     exploratory=exploratory, block_s=round(block_s, 3), max_pairs=max_pairs, bar=round(bar, 4),
                     mean_context=round(mean_ctx, 1), why=why,
                     explored_s=None if explore is None else round(explore[0], 3),
                     explore_least_s=None if explore is None else round(explore[1], 3),
                     explore_budget_s=None if explore is None else round(explore[2], 3))

    def _timed(self, engine: Engine, kv: str) -> bool:
        """This machine's step times at a KV type are known: the sim's card states them; on a real backend a
        fit of its own steps, a probe in a side cache, or what an experiment measured of it."""
        if engine.backend.source == "simulated" or kv in self._measured_scale:
            return True
        return not self.step_time_source(engine, kv).startswith("borrowed")

    def _switch_s(self, engine: Engine, a: Setting, b: Setting) -> float:
        return 0.0 if a.kv == b.kv else self.measured.switch_s(engine, a.kv)

    def _block_s(self, engine: Engine, a: Setting, b: Setting) -> float:
        """A block's least length: Goal.block_s, or BLOCK_PER_SWITCH switches' worth where switching costs."""
        return max(self.goal.block_s, BLOCK_PER_SWITCH * self._switch_s(engine, a, b))

    # running an experiment
    def _experiment_step(self, engine: Engine, rec: StepRecord) -> list[TuneEvent]:
        x = self._exp
        assert x is not None
        live = self.setting(engine)
        if live not in (x.incumbent, x.candidate) and not self._switching:
            return self._end(engine, "abandoned", live)  # a person moved the setting under it
        before = sum(b.tally.seconds for b in x.blocks)
        nxt = x.add(rec, live)
        spent = sum(b.tally.seconds for b in x.blocks) - before
        self.cost.experiment_s += spent
        if x.exploratory:
            self._explored_s += spent
        if nxt is None:
            if self.goal.run_s is not None and engine.now_s() >= self.goal.run_s - 1e-9:
                return self._end(engine, "ended", live)
            return []
        verdict = self._judge(engine, x) if len(x.blocks) % 2 == 1 else None  # a pair just closed
        if verdict is None and len(x.blocks) % 2 == 1 and not self._room_for_a_pair(engine, x):
            verdict = "gave up"
        if verdict is not None:
            return self._end(engine, verdict, live)
        self._move(engine, live, x.setting_for(nxt))
        return []

    def _max_block_s(self, now: float) -> float:
        return max(MAX_BLOCK_EPOCHS * self.goal.epoch_s, self.horizon_at(now) / 6)

    def _room_for_a_pair(self, engine: Engine, x: Experiment) -> bool:
        """Another pair fits: its blocks at most MAX_BLOCK_EPOCHS epochs or a sixth of the horizon (a switch
        dearer than a quarter of that costs more than an experiment can find), and, in a run of known
        length, as long again left after it to reap what it finds."""
        if x.block_s > self._max_block_s(engine.now_s()):
            return False
        return self.goal.run_s is None or self.goal.run_s - engine.now_s() >= 2 * 2 * x.block_s

    def _judge(self, engine: Engine, x: Experiment) -> str | None:
        """kept | rejected | gave up, or None for another pair. With the step times' pairs: B's model scaled
        by what they measured (each bound), the rest of the run forecast again both ways; kept where even
        the unfavourable bound clears the bar and the forecast's own error, rejected where even the
        favourable one falls short of the bar. A cap or a residency is kept only where the objective's own
        pairs agree (their central gain past the bar), and rejected where they fall short at 95%. Without
        step pairs (no model yet), the objective's pairs alone decide. (For a KV type they are no guard: one
        that holds more of the swarm in the budget spends its first blocks prefilling what it newly admits,
        and the other gives it back on the way out, so over blocks of a second or two they measure the
        budget's churn against the candidate, not the setting.)"""
        obj = x.result()
        if obj.pairs < MIN_PAIRS:
            return self._judge_early(engine, x)
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
        elif not (self._thinking_spent(engine.now_s()) and obj.pairs < x.max_pairs):
            # a KV type's factor is put on attention (what grows with the contexts) where its pairs could tell
            # it apart; until then it is not kept on the whole step alone (which says too little of longer
            # contexts), but may be rejected or given up on it
            pre = x.step_factor("prefill") or (1.0, 1.0, 1.0)
            att = x.step_factor("attention") if kv_change else None

            def scale(k: int) -> StepScale:
                if att is not None:
                    return StepScale(prefill=pre[k], attention=att[k])
                return StepScale(decode=dec[k], prefill=pre[k])

            t0, c0, f0 = time.perf_counter(), time.thread_time(), self.cost.forecasts
            try:
                unf = self._corrected_gain(engine, x, scale(2)) if att is not None or not kv_change else None
                mid = self._corrected_gain(engine, x, scale(0))
                # the forecast that turns measured step times into a gain has its own error (this run's checked
                # forecasts of staying): a gain kept on it clears that too, not the bar alone
                if unf is not None and unf > x.bar + math.log1p(x.forecast_error) and pairs_agree:
                    x.corrected = (unf, mid, None)
                    return "kept"
                fav = self._corrected_gain(engine, x, scale(1))
                x.corrected = (unf, mid, fav)
                if (fav is not None and fav < x.bar) or (short and not kv_change):
                    return "rejected"
                # futile: a pair past the least, and even its central estimate short of what keeping needs;
                # more pairs would mostly cost the candidate's blocks (it stays where it was, as at its budget)
                if obj.pairs > MIN_PAIRS and (mid is None or mid <= x.bar + math.log1p(x.forecast_error)):
                    return "gave up"
            finally:
                self._think(engine, t0, c0, self.cost.forecasts - f0)
        return "gave up" if obj.pairs >= x.max_pairs else None

    def _judge_early(self, engine: Engine, x: Experiment) -> str | None:
        """On one or two pairs: "rejected" where, with the incumbent's own noise before the experiment for
        their spread, even the favourable bound falls short of the bar (as _judge decides with three or more:
        on the step times forecast again for a KV type, on the objective's pairs for the others), else None.
        Nothing is kept on so few pairs."""
        obj = x.early_result()
        kv_change = x.candidate.kv != x.incumbent.kv
        if not kv_change or x.model is None:
            return "rejected" if obj is not None and obj.high is not None and math.log1p(obj.high) < x.bar else None
        dec = x.early_step_factor("decode")
        if dec is None or self._thinking_spent(engine.now_s()):
            return None
        pre = x.early_step_factor("prefill") or (1.0, 1.0, 1.0)
        t0, c0, f0 = time.perf_counter(), time.thread_time(), self.cost.forecasts
        try:
            fav = self._corrected_gain(engine, x, StepScale(decode=dec[1], prefill=pre[1]))
        finally:
            self._think(engine, t0, c0, self.cost.forecasts - f0)
        if fav is not None and fav < x.bar:
            x.corrected = (None, None, fav)
            return "rejected"
        return None

    def _corrected_gain(self, engine: Engine, x: Experiment, sc: StepScale) -> float | None:
        """log of the objective's gain of the candidate over the incumbent, forecast over what is left of the
        horizon with the candidate's step times scaled by these factors (what its steps measured against the
        model, relative to the incumbent's)."""
        n = len(engine.agents)
        # one draw of tool latencies, the same both ways: what the two differ in is the setting, and a verdict
        # is forecast several times over (each bound), on the engine's own thread
        stay = self.forecast(engine, x.incumbent, range(1))
        new = self.forecast(engine, x.candidate, range(1), scale={x.candidate.kv: sc})
        if stay is None or new is None:
            return None
        g = _gain(sum(r[-1].score(self.goal, n) for r in new) / len(new),
                  sum(r[-1].score(self.goal, n) for r in stay) / len(stay))
        return None if g is None or g <= -1 else math.log1p(g)

    def _move(self, engine: Engine, cur: Setting, to: Setting) -> bool:
        if cur == to:
            return True
        try:
            engine.request(Control(batch_cap=to.batch_cap if to.batch_cap != cur.batch_cap else None,
                                   kv=to.kv if to.kv != cur.kv else None,
                                   residency=to.residency if to.residency != cur.residency else None))
        except UserError:  # the swarm changed under it (agents removed meanwhile)
            return False
        self.cost.switches += 1
        if to.kv != cur.kv:
            self._switching = True
        self.checks.drop_moved(self.setting(engine))
        return True

    def _end(self, engine: Engine, result: str, live: Setting) -> list[TuneEvent]:
        """An experiment's end: the swarm at the winner (the incumbent unless kept), its record, its cost."""
        x = self._exp
        assert x is not None
        self._exp = None
        r = x.result()
        mean_ctx = mean_context([a.context for a in engine.agents])
        keep = x.candidate if result == "kept" else x.incumbent
        if result != "abandoned":
            self._move(engine, live, keep)
        loser = x.incumbent if result == "kept" else x.candidate
        if result != "abandoned":
            self._tried[loser] = (mean_ctx, engine.s.kv_budget_bytes, turn_shape(engine))
        lost = x.tokens_lost()
        self.cost.tokens_lost += lost
        self._epoch_start_s = engine.now_s()  # the next look an epoch from now, on the setting it holds
        self.checks.drop_moved(self.setting(engine))
        fv = self._forecast_verdict(x)
        # on fewer than MIN_PAIRS pairs (rejected early), the factors with the incumbent's noise for a spread
        dec = x.step_factor("decode") or x.early_step_factor("decode")
        pre = x.step_factor("prefill") or x.early_step_factor("prefill")
        att = x.step_factor("attention")
        if r.pairs < MIN_PAIRS and (early := x.early_result()) is not None:
            r = early
        if x.candidate.kv != x.incumbent.kv and x.model is not None and (att or dec) is not None:
            # what its steps measured stands for the type in later forecasts: its central factors against the
            # model unscaled (an experiment's frozen model is), relative to the incumbent's
            self._measured_scale[x.candidate.kv] = StepScale(
                decode=1.0 if att is not None or dec is None else dec[0], prefill=pre[0] if pre else 1.0,
                attention=None if att is None else att[0])
        unf, mid, fav = x.corrected or (None, None, None)
        g = "n/a" if r.gain is None else f"{r.gain:+.1%}"
        bounds = "" if r.low is None else f" (95%: {r.low:+.1%} to {r.high:+.1%})"
        steps = "" if dec is None else (f"; its decode steps {dec[0]:.2f}x the model's relative to the incumbent's "
                                       f"({dec[1]:.2f}-{dec[2]:.2f})"
                                       + ("" if pre is None else f", prefill {pre[0]:.2f}x"))
        again = "" if mid is None else f"; forecast again on them {math.expm1(mid):+.1%}" + (
            "" if unf is None else f" (at worst {math.expm1(unf):+.1%})")
        words = {"kept": f"kept: past its bar {x.bar:+.1%}",
                 "rejected": f"not kept: short of its bar {x.bar:+.1%}",
                 "gave up": f"not kept: no verdict after {r.pairs} pairs (its budget, or its central estimate "
                            "short of what keeping needs)",
                 "ended": "the run ended before a verdict",
                 "abandoned": f"abandoned: the setting moved to {live.label()}"}
        why = (f"tune experiment: {_what(x.incumbent, x.candidate)} over {r.pairs} interleaved pairs: objective "
               f"{g}{bounds} (measured){steps}{again} (modeled); forecast "
               + ("n/a" if x.forecast_gain is None else f"{x.forecast_gain:+.1%}")
               + f" ({fv or 'no verdict'}); {words[result]}; its switches {x.switch_s:.2f} s, "
                 f"{x.switch_cells:,} cells, {lost:+.0f} tokens lost to it")
        out: list[TuneEvent] = [Experimented(
            from_=x.incumbent, to=x.candidate, objective=self.goal.objective, result=result, pairs=r.pairs,
            objective_gain=_round(r.gain), objective_low=_round(r.low), objective_high=_round(r.high),
            decode_factor=None if dec is None else round(dec[0], 4),
            decode_factor_low=None if dec is None else round(dec[1], 4),
            decode_factor_high=None if dec is None else round(dec[2], 4),
            prefill_factor=None if pre is None else round(pre[0], 4),
            corrected_gain=None if mid is None else round(math.expm1(mid), 4),
            corrected_low=None if unf is None else round(math.expm1(unf), 4),
            corrected_high=None if fav is None else round(math.expm1(fav), 4),
            confidence=CONFIDENCE, forecast_gain=_round(x.forecast_gain), verdict=fv,
            seconds_incumbent=round(x.seconds_on("A"), 2), seconds_candidate=round(x.seconds_on("B"), 2),
            switches=x.switches_made(), switch_s=round(x.switch_s, 3), switch_cells=x.switch_cells,
            tokens_lost=round(lost, 1),
            source=f"{engine.backend.source}: paired blocks, Student's t on the pairs' spread (measured); the "
                   "corrected gain forecast on the measured step times (modeled)",
            why=why)]
        if result == "kept":
            horizon = self.horizon_at(engine.now_s())
            out.append(Decision(
                from_=x.incumbent, to=x.candidate, objective=self.goal.objective,
                predicted_gain=round(math.expm1(mid), 4) if mid is not None else _round(r.gain) or 0.0,
                predicted_gain_source="modeled on step times measured in an experiment" if mid is not None
                else "measured: the objective in interleaved pairs", trial=x.exploratory,
                forecast_spread=None, horizon_s=round(horizon, 1), mean_context=round(mean_ctx, 1),
                forecast_error=round(x.forecast_error, 4), forecast_error_source="the proposal's (modeled)",
                kv_step_time_source=None,
                why=f"tune: {_what(x.incumbent, x.candidate)}: kept on what the swarm measured ({words[result]})"))
        s = self.cost
        out.append(Spent(think_s=round(s.think_s, 3), think_cpu_s=round(s.think_cpu_s, 3), forecasts=s.forecasts,
                         looks=s.looks, looks_skipped=s.looks_skipped, probe_s=round(s.probe_s, 3),
                         switches=s.switches, switch_s=round(s.switch_s, 3), switch_cells=s.switch_cells,
                         experiments=s.experiments, experiment_s=round(s.experiment_s, 2),
                         tokens_lost=round(s.tokens_lost, 1), why=s.line(engine.now_s())))
        return out

    def _forecast_verdict(self, x: Experiment) -> str | None:
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

    def outcome_now(self, engine: Engine) -> Experimented | None:
        """An experiment still running when the run ends: what it measured so far (no verdict on the setting;
        the forecast's verdict where there are pairs enough). The swarm is left as it is."""
        if self._exp is None:
            return None
        out = self._end(engine, "ended", self.setting(engine))
        return next((e for e in out if isinstance(e, Experimented)), None)

    def _learned_scale(self, engine: Engine) -> dict[str, StepScale]:
        """The step-time factors experiments measured, for the KV types whose model is still not their own
        steps' fit (always, on the sim: its model is the stated card)."""
        out = {}
        for kv, sc in self._measured_scale.items():
            own = engine.analysis.fit(kv)
            if engine.backend.source == "simulated" or own is None or own.samples < MIN_OWN_FIT_SAMPLES:
                out[kv] = sc
        return out

    def _retry_blocked(self, engine: Engine, s: Setting, mean_ctx: float) -> bool:
        """A setting an experiment did not keep (or replaced), under conditions that have not moved since: the
        contexts, the budget and the turns' shape."""
        p = self._tried.get(s)
        if p is None:
            return False
        ctx, budget, shape = p
        moved = abs(mean_ctx - ctx) >= RETRY_CONTEXT_CHANGE * max(ctx, REVISIT_MIN_CONTEXT)
        return not moved and budget == engine.s.kv_budget_bytes and shape == turn_shape(engine)

def _ledger(engine: Engine):
    """The live quality check's ledger (engine/quality_check.py), where the engine has one."""
    return getattr(engine.quality, "ledger", None)


def _spread(gains: list[float | None]) -> float | None:
    """Half the range of per-draw gains; None if any is missing or not finite."""
    vals = [g for g in gains if g is not None and math.isfinite(g)]
    if not gains or len(vals) < len(gains):
        return None
    return (max(vals) - min(vals)) / 2


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _mean(values) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _gain(new: float, old: float) -> float | None:
    """Relative improvement of a score; scores below zero (over a cap, under a floor) count from there.
    None from a zero score: no gain can be stated against nothing."""
    if old != 0:
        return (new - old) / abs(old)
    return None


def _what(a: Setting, b: Setting) -> str:
    return ", ".join(f"{k} {getattr(a, k)} -> {getattr(b, k)}" for k in ("batch_cap", "kv", "residency")
                     if getattr(a, k) != getattr(b, k))


def turn_shape(engine: Engine) -> tuple[int, int]:
    """What a turn generates and what its tool result adds: the workload's shape, which the forecasts take
    from the engine's settings, and which can change while the swarm runs."""
    return engine.s.gen_tokens, engine.s.tool_tokens

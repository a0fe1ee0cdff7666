"""The auto-tuner: holds a running swarm at its best setting (batch cap, KV type, residency) as it moves.

A forecast proposes; the swarm decides. At the end of each epoch the tuner forecasts the next `horizon_s`
seconds from the swarm's present state under the current setting and each neighbour, by running the workload
forward in a simulator (the sim profile as stated on the sim backend; on a real one a simulator calibrated
on this run's own steps: engine/tune/forecast.py). The best neighbour, where its forecast gain clears the
margin and the forecast's error, or lies within that error while the exploration budget lasts
(engine/tune/propose.py), is then tried on the live swarm against the setting it would replace: the two take
turns in short interleaved blocks, and it is kept only where the measured pairs say, at one-sided 95%, that
it gains more than going over costs; shown not to, or still undecided when its budget of pairs is spent, the
swarm stays where it was (engine/tune/experiment.py, verdict.py). So a model that is wrong on this machine
(a KV type's cost, a card's bandwidth) can waste an experiment, never hold the swarm at a worse setting.

Forecasts of staying are checked against what came, span by span: their rms error is the error a
proposal is judged against. Everything the tuner spends is counted (engine/tune/cost.py): its thinking,
which runs on the engine's own thread and is held to `think_share` of the run, its probes, its switches'
seconds and cells, and the tokens its experiments cost. This class wires those parts and owns what
moves between records: the experiment under way, the epoch, the recent steps, the switch in flight.
"""

import math
import time
from dataclasses import replace

from swarmtune.engine.engine_view import EngineView
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.measure.budget_fill import ResidentGrowth
from swarmtune.engine.record.records import StepRecord
from swarmtune.engine.tune.cost import Spending
from swarmtune.engine.tune.draft_trial import DraftTrial
from swarmtune.engine.tune.events import Experimented, Probed, Trial, TuneEvent
from swarmtune.engine.tune.experiment import MIN_PAIRS
from swarmtune.engine.tune.forecast import Forecaster, Runs
from swarmtune.engine.tune.goal import Goal, Setting
from swarmtune.engine.tune.measured import MIN_OWN_FIT_SAMPLES, Measured
from swarmtune.engine.tune.outcome import ForecastChecks
from swarmtune.engine.tune.propose import Proposer, turn_shape
from swarmtune.engine.tune.quality_guard import quality_guard
from swarmtune.engine.tune.recent import RecentSteps
from swarmtune.engine.tune.tally import SpanTally
from swarmtune.engine.tune.trials import Trials, setting_of
from swarmtune.engine.tune.verdict import Judge

# a look that found nothing within reach (every neighbour forecast worse past its error) makes the next wait this
# many epochs: thinking scaled down where it could gain nothing. Not more: what a look would see changing without
# the turns' shape changing (contexts growing toward the KV budget) must still be seen within a short run
WAIT_EPOCHS_MAX = 2


class Tuner:
    """Wires the parts: each record is accounted and remembered; an experiment under way takes its next
    block or its verdict; else, once an epoch, a look forecasts staying and proposes."""

    def __init__(self, goal: Goal) -> None:
        self._goal = goal
        # what it learned of this machine, kept across a restart
        self.measured = Measured()
        self.checks = ForecastChecks()  # its forecasts of staying, checked: its stated error
        self.cost = Spending()
        self.growth = ResidentGrowth()  # the resident histories': when the KV budget binds (budget_outlook.py)
        # what the last budget line said: said again only once it changes
        self._foreseen: tuple[Setting, Setting | None, bool] | None = None
        self.forecaster = Forecaster(goal, self.measured, self.cost)
        self.judge = Judge(goal, self.forecaster)
        self.proposer = Proposer(goal, self.forecaster, self.checks, self.judge)
        self.trials = Trials(goal, self.measured, self.cost, self.checks, self.judge, self.forecaster,
                             self.proposer, on_end=self._epoch_from)
        self.drafting = DraftTrial(self.cost)  # --draft auto: whether drafts ride, measured against none
        self.drafting.objective = goal.objective  # what its blocks are judged on
        self.restart()

    @property
    def goal(self) -> Goal:
        return self._goal

    @goal.setter
    def goal(self, goal: Goal) -> None:
        """A goal set again (a run's length once known): every part reads the new one."""
        self._goal = self.forecaster.goal = self.judge.goal = self.proposer.goal = self.trials.goal = goal
        self.drafting.objective = goal.objective

    def restart(self) -> None:
        """Forget what it was measuring (turned on, or on again): it starts a fresh epoch."""
        self._epoch_start_s: float | None = None
        self._looked = False
        self._young_look = False  # the last look changed nothing, on a fit of fewer than MIN_OWN_FIT_SAMPLES steps
        self._wait_epochs = 1  # epochs until the next look: more after one that found nothing within reach
        self._quiet_shape: tuple[int, int] | None = None  # the turns' shape then: a new one looks at once
        self._waived = False  # this wait's waived look is counted
        self._convert_tried = False  # a probe by conversion was weighed (engine/tune/measured.py): once a run
        self._step_s: float | None = None  # the latest decode step's seconds: a probe's estimate
        self.checks.restart()
        self.trials.restart()  # the experiment under way, the switch in flight
        self.drafting.restart()
        self._recent = RecentSteps()  # the noise an experiment starts with

    # what the engine calls after every record
    def observe(self, engine: EngineView, rec: StepRecord) -> list[TuneEvent]:
        out: list[TuneEvent] = []
        now = engine.now_s()
        if self._epoch_start_s is None:
            self._epoch_start_s = now
        self.measured.learn(rec)
        self.growth.add(rec)
        self.trials.account(rec)
        self._recent.add(rec, self.setting(engine))
        if not self._looked and engine.backend.source != "simulated" and self.goal.probes_pay():
            # before the first look, whose forecasts need every allowed type's step time: measuring, not
            # forecasting (its seconds are the tuner's probe cost), once per type and run
            out += self._probe_missing(engine, self.setting(engine))
        elif self._looked and engine.backend.source != "simulated" and not self._convert_tried:
            out += self._probe_converted(engine, rec, now)
        out += quality_guard(self.goal, engine, self.trials, self.proposer)
        self.checks.drop_moved(self.setting(engine))
        self.checks.observe(rec, self.goal)
        if self.trials.exp is not None:
            return out + self.trials.step(engine, rec)
        out += self.drafting.observe(engine, rec, free=self._looked, run_s=self.goal.run_s)
        if self.drafting.running:  # its blocks are the swarm's for now: a look waits for its verdict
            return out
        first_look = not self._looked and self.forecaster.simulator(engine) is not None
        waited = now - self._epoch_start_s
        due = self.goal.epoch_s * (self._wait_epochs if turn_shape(engine) == self._quiet_shape else 1)
        if rec.kind == "rebuild" or (waited < due and not first_look and not self._fit_matured(engine)):
            if waited >= self.goal.epoch_s and rec.kind != "rebuild" and not self._waived:
                self._waived = True
                self.cost.looks_waived += 1
            return out
        return out + self._look(engine, now)

    def _fit_matured(self, engine: EngineView) -> bool:
        """A first look that changed nothing was made on a fit of a few steps (a real backend's model of this
        machine is its own steps): once that fit has MIN_OWN_FIT_SAMPLES, it looks again rather than an epoch
        later."""
        if not self._young_look:
            return False
        fit = engine.analysis.fit(engine.s.kv)
        return fit is not None and fit.samples >= MIN_OWN_FIT_SAMPLES

    def prepare(self, engine: EngineView) -> list[TuneEvent]:
        """At the run's start, before its first step (a real backend): time the allowed KV types in a side
        cache, then take the first look at once (an experiment's first block begins with the first step)."""
        if engine.backend.source == "simulated" or self._looked:
            return []
        if self._epoch_start_s is None:
            self._epoch_start_s = engine.now_s()
        if not self.goal.probes_pay():
            return []
        out = self._probe_missing(engine, self.setting(engine))
        if self.forecaster.simulator(engine) is not None:
            out += self._look(engine, engine.now_s(), kv_only=True)
        return out

    def _look(self, engine: EngineView, now: float, kv_only: bool = False, probed: bool = False) -> list[TuneEvent]:
        """Forecast staying (checked later against what comes) and propose: an experiment, or nothing.
        kv_only: weigh only the KV types (a look before the first step, or on a probe just made). probed: the
        look on what a probe just measured, taken whatever was thought before (once a run, the KV types
        only; its seconds are counted as any look's, and the looks after it wait for the average)."""
        self._looked = True
        self._epoch_start_s = now
        self._young_look = False
        self._waived = False
        if self.forecaster.thinking_spent(now) and not probed:
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
            fc = self.forecaster
            self.checks.add(fc.objectives(base), SpanTally(now, fc.spans_for(fc.horizon_at(now))), cur)
            trial = self.propose(engine, cur, base, kv_only)
            out += self._budget_line(cur, trial)
            self._pace(engine, trial, kv_only)
            if trial is not None:
                out.append(trial)
        self.forecaster.think(engine, t0, c0, self.cost.forecasts - forecasts_before)
        if engine.should_yield():  # a pause came mid-look: what it forecast is partial, so nothing is tried
            return []
        if not out and engine.backend.source != "simulated":
            fit = engine.analysis.fit(cur.kv)
            self._young_look = fit is None or fit.samples < MIN_OWN_FIT_SAMPLES
        return out

    def _pace(self, engine: EngineView, trial: Trial | None, kv_only: bool) -> None:
        """When the next look comes: a second epoch later where this one found nothing within reach of an
        experiment (no forecast gain that its error could carry past 0) and the KV budget does not bind within
        the horizon; else an epoch later. A look on the KV types alone says nothing of the others."""
        reach, o = self.proposer.reach, self.proposer.outlook
        nothing = (trial is None and not kv_only and reach is not None and reach <= 0
                   and (o is None or not o.binds()))
        self._wait_epochs = min(2 * self._wait_epochs, WAIT_EPOCHS_MAX) if nothing else 1
        self._quiet_shape = turn_shape(engine)

    def _budget_line(self, cur: Setting, trial: Trial | None) -> list[TuneEvent]:
        """Where the KV budget binds within the horizon at the setting in force: one line saying when, what
        staying will re-prefill, each way out and what it costs, and which one the tuner weighs (the trial's);
        said again only when the setting, the way weighed or the quality budget's exclusions change."""
        o = self.proposer.outlook
        if o is None or not o.binds():
            return []
        weighing = trial.to if trial is not None else None
        key = (cur, weighing, o.ruled_out is not None)
        if key == self._foreseen:
            return []
        self._foreseen = key
        return [o.event(cur, self.goal.objective, weighing)]

    @staticmethod
    def setting(engine: EngineView) -> Setting:
        return setting_of(engine)

    def _epoch_from(self, now_s: float) -> None:
        self._epoch_start_s = now_s

    def stated_error(self, span: int | None = None) -> float | None:
        """The stated error over a span (engine/tune/outcome.py); by default the default horizon's last."""
        return self.checks.stated_error(len(self.spans) - 1 if span is None else span)

    @property
    def spans(self) -> list[float]:
        """The spans of a forecast over the default horizon."""
        return self.forecaster.spans_for(self.goal.horizon_s)

    def forecast(self, engine: EngineView, setting: Setting) -> Runs | None:
        return self.forecaster.forecast(engine, setting)

    def candidates(self, engine: EngineView, cur: Setting) -> list[Setting]:
        return self.proposer.candidates(engine, cur)

    def propose(self, engine: EngineView, cur: Setting, base: Runs, kv_only: bool) -> Trial | None:
        """An experiment, where the proposer finds one worth it: it starts with the next record."""
        proposed = self.proposer.propose(engine, cur, base, kv_only, self.trials.explored_s, self._recent.at(cur),
                                         probe_pending=self._probe_pending(engine, cur), growth=self.growth)
        if proposed is None:
            return None
        self.trials.exp, trial = proposed
        self.cost.experiments += 1
        return trial

    def _probe_converted(self, engine: EngineView, rec: StepRecord, now: float) -> list[TuneEvent]:
        """A run too short for prefilled probes: once an agent holds a history, the KV types no forecast has
        this machine's step time for are timed on it, converted (a sixth of a prefilled probe's seconds on a
        2-core CPU: docs/tuner.md), where its estimate fits in the exploration budget (what it took is
        counted there, as an experiment's blocks are); then a look at once, on what it measured. Once a run."""
        if rec.kind == "decode" and rec.seconds > 0:
            self._step_s = rec.seconds
        if self.trials.exp is not None or self.trials.switching or self._step_s is None:
            return []
        cur = self.setting(engine)
        kvs = self._convertible_unprobed(engine, cur)
        src = self.measured.history_to_probe(engine) if kvs else None
        if src is None:
            return []
        self._convert_tried = True
        estimate_s = self.measured.convert_probe_s(engine, cur.kv, kvs, src.context, self._step_s)
        whole = self.goal.run_s if self.goal.run_s is not None else max(now, self.goal.horizon_s)
        left_s = math.inf if self.goal.run_s is None else self.goal.run_s - now
        if self.trials.explored_s + estimate_s > self.goal.explore_share * whole or left_s < 2 * estimate_s:
            return []
        before = self.cost.probe_s
        out = self.measured.probe_missing(engine, cur.kv, set(kvs), self.cost, source=src)
        self.trials.explored_s += self.cost.probe_s - before
        if any(isinstance(e, Probed) and e.error is None for e in out):
            # the KV types' first forecasts on this machine's figures: what the probe was for, not to be
            # skipped for the looks before it (which could not try an untimed type)
            out += self._look(engine, engine.now_s(), kv_only=True, probed=True)
        return out

    def _convertible_unprobed(self, engine: EngineView, cur: Setting) -> list[KVSetting]:
        """The candidate KV types a probe by conversion would time (none where one cannot be converted to)."""
        kvs = self.measured.unprobed(engine, {c.kv for c in self.candidates(engine, cur)} - {cur.kv})
        if any(engine.backend.caps.converts(cur.kv, k) is not None for k in kvs):
            return []
        # a type no experiment could try in what is left (its switches there and back too dear) is not worth
        # timing: the probe's seconds would buy nothing
        return [k for k in kvs if self.proposer.can_try(engine, cur, replace(cur, kv=k), engine.now_s())]

    def _probe_pending(self, engine: EngineView, cur: Setting) -> bool:
        """A probe by conversion is still to come: a run too short for prefilled probes, a candidate KV type
        not timed, and the swarm's history not yet long enough to time it on."""
        return (not self._convert_tried and engine.backend.source != "simulated" and not self.goal.probes_pay()
                and bool(self._convertible_unprobed(engine, cur)))

    def _probe_missing(self, engine: EngineView, cur: Setting) -> list[TuneEvent]:
        kvs = {c.kv for c in self.candidates(engine, cur)} - {cur.kv}
        return self.measured.probe_missing(engine, cur.kv, kvs, self.cost)

    def outcome_now(self, engine: EngineView) -> Experimented | None:
        """An experiment still running when the run ends: what it measured so far (engine/tune/trials.py)."""
        return self.trials.outcome_now(engine)

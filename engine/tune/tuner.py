"""The auto-tuner: holds a running swarm at its best setting (batch cap, KV type, residency) as it moves.

At the end of each epoch it forecasts the next `horizon_s` seconds from the swarm's present state (every
agent's context, state and tool wait) under the current setting and under its neighbours, by running the
workload forward in a simulator: the sim profile itself on the sim backend, or, on a real one, a
simulator calibrated on this run (per KV type a step-time fit and a prefill-time fit; the measured swap
bandwidth). On a real backend every allowed KV type is timed in a side cache before it is forecast
(engine/kv_probe.py), and the first look comes before the swarm's first step, when a KV switch is free.
It switches only when the forecast gain beats a margin, no sooner than `dwell_s` after its last change,
and back to a setting it left only once the contexts have moved (hysteresis); a KV switch pays its
re-prefill inside the forecast. Each decision is a `tune` record; a second one, once the horizon
has passed (or at the next decision, if sooner), says what was measured against what was forecast for
that same stretch.

Its stated error is measured too: every epoch it forecasts staying put and, as the stretch unfolds,
checks that forecast against what came, for each span (one epoch, two, ... up to the horizon). An
outcome over a span is judged against twice the rms error of those checks over the same span: over
30 s a swarm with tool waits is mostly luck, over 120 s much less.

Forecasts draw tool latencies from their own stream: the tuner does not know the future.
"""

import math
import statistics
import time
from dataclasses import dataclass, replace

from swarmtune.engine.backend import NoKVSlot
from swarmtune.engine.control import Control
from swarmtune.engine.engine import Engine  # the engine takes a tuner as a value; it never imports this package
from swarmtune.engine.errors import Stalled, UserError
from swarmtune.engine.kv_probe import KvProbe, long_context, probe_kv
from swarmtune.engine.kv_types import KV_TYPES
from swarmtune.engine.power.meter import ModeledMeter, NoMeter
from swarmtune.engine.prefill_model import PrefillCalibration, PrefillFit
from swarmtune.engine.profiles import Profile
from swarmtune.engine.records import StepRecord, mean_context
from swarmtune.engine.settings import RESIDENCY, min_context
from swarmtune.engine.sim_backend import SimBackend
from swarmtune.engine.step_model import Fit
from swarmtune.engine.tune.goal import Goal, Setting
from swarmtune.engine.tune.simulator import CalibratedSim, SimStepCost
from swarmtune.engine.tune.tally import SpanTally, Tally
from swarmtune.engine.tune.watch import MIN_STEPS, TOLERANCE, Watch, verdict
from swarmtune.engine.tune_events import (
    Confirmed,
    Decision,
    Held,
    Outcome,
    Probed,
    Reverted,
    RevertRefused,
    TuneEvent,
)

FORECAST_SEED_SALT = 7919  # the forecast's tool latencies come from another stream than the run's
# a KV type's own fit stands for it once it has this many steps; before, its probe (timed in a side cache)
# does: a fit of a few steps at one batch size says little about the others
MIN_OWN_FIT_SAMPLES = 32
# contexts "moved 25%" from a setting left with (nearly) empty caches means moved 25% of this many tokens
REVISIT_MIN_CONTEXT = 256.0
# a setting reverted as measurably worse is tried again only once the contexts moved this much (or the budget)
PENALTY_CONTEXT_CHANGE = 0.5
# a trial (a KV type tried on the swarm because its model could not judge it) is re-forecast this many times,
# each on twice the decode steps of the last, before it holds (its central gain at least zero) for the forecasts
TRIAL_CHECKS = 2
MAX_CHECKS = 3  # a change neither measurably better nor worse after this many is left to the forecasts
PROBE_MIN_RUN_S = 600.0  # a run this long or longer (or of unknown length) times its KV types in a side cache
# a change needs this many epochs of a run of known length left: one to be checked by the closed loop and
# one to pay for itself. Over a last epoch or so the forecasts are of a few discrete events (a prefill, a
# preemption) and swung by them: here +71% forecast at 14 s before the end, -27% measured
LAST_CHANGE_EPOCHS = 2
OUTCOME_MIN_SPANS = 2  # the objective is compared with the forecast of staying from this many epochs on
# a trial is made only where what it may cost (two conversions and its steps at half speed) is at most this
# share of what is left of the horizon
TRIAL_SHARE = 0.02
# a type never timed on this machine (no probe, no trial: a short run) is worth more to try: its model is
# another type's, unscaled, and on these CPUs that is wrong by 0.7-2x either way
TRIAL_SHARE_UNTIMED = 0.05
TRIAL_LOSS = 0.5


class Tuner:
    def __init__(self, goal: Goal) -> None:
        self.goal = goal
        # what it learned of this machine, kept across a restart
        self._prefill: dict[str, PrefillCalibration] = {}  # per KV type: measured prefill chunks
        self._swap: list[tuple[int, float]] = []  # (bytes, seconds) of measured swaps
        self._errors: dict[int, list[float]] = {}  # span index -> forecast / measured - 1 of staying
        self._thought_s = 0.0  # wall seconds spent forecasting
        self._probes: dict[str, KvProbe | None] = {}  # KV type -> its probe (None: it could not be timed)
        # settings reverted as measurably worse: the mean context and KV budget then, and their q (measured
        # over forecast step times); not tried again until those conditions move
        self._penalties: dict[Setting, tuple[float, float | None, float, tuple[int, int]]] = {}
        # KV types tried on the swarm: their step-time and prefill models as corrected by what they measured
        self._kv_correction: dict[str, tuple[Fit, PrefillFit | None]] = {}
        # KV type -> the mean context its last trial began at, and the turns' shape then
        self._tried: dict[str, tuple[float, tuple[int, int]]] = {}
        self._convert: list[tuple[int, float]] = []  # (bytes, seconds) of measured KV conversions
        self.restart()

    def restart(self) -> None:
        """Forget what it was measuring (turned on, or on again): it starts a fresh epoch."""
        self._epoch_start_s: float | None = None
        self._last_change_s = -math.inf
        self._pending: Pending | None = None  # a decision whose outcome is being measured
        self._pending_tally: SpanTally | None = None
        self._looked = False
        self._young_look = False  # the last look changed nothing, on a fit of fewer than MIN_OWN_FIT_SAMPLES steps
        self._left_at_context: dict[Setting, float] = {}  # a setting left -> the mean context then
        # forecasts of staying being checked: (what each span was forecast to hold, what came, at which setting)
        self._checks: list[tuple[list[float | None], SpanTally, Setting]] = []
        # the last change (from, to), checked step by step against its forecast's model
        self._watch: tuple[Watch, Setting, Setting] | None = None

    # what the engine calls after every record
    def observe(self, engine: Engine, rec: StepRecord) -> list[TuneEvent]:
        out: list[TuneEvent] = []
        now = engine.now_s()
        if self._epoch_start_s is None:
            self._epoch_start_s = now
        self._learn(rec)
        if not self._looked and engine.backend.source != "simulated" and self.probes_pay():
            # before the first look, whose forecasts need every allowed type's step time; measuring, not
            # forecasting, so outside the thinking budget, and once per type and run
            out += self._probe_missing(engine, self.setting(engine))
        self._drop_moved_checks(engine)
        for _, came, _ in self._checks:
            came.add(rec)
        self._close_checks()
        if self._pending is not None and self._pending_tally is not None:
            before = len(self._pending_tally.closed)
            self._pending_tally.add(rec)
            if len(self._pending_tally.closed) == len(self._pending_tally.spans):
                out.append(self._measured(engine))
            elif len(self._pending_tally.closed) > before >= OUTCOME_MIN_SPANS - 1:
                out += self._check_outcome(engine)
        out += self._check_watch(engine, rec)
        # the first look comes as soon as there is something to forecast with: a switch is cheapest early,
        # while the caches it re-prefills are short
        first_look = not self._looked and self._simulator(engine) is not None
        if rec.kind == "rebuild" or (now - self._epoch_start_s < self.goal.epoch_s and not first_look
                                     and not self._fit_matured(engine)):
            return out
        return out + self._look(engine, now)

    def _fit_matured(self, engine: Engine) -> bool:
        """A first look that changed nothing was made on a fit of a few steps (a real backend's model of this
        machine is its own steps): once that fit has MIN_OWN_FIT_SAMPLES, it looks again rather than an epoch
        later. An epoch is a sixth of a 64 s run, a KV switch is cheapest while the caches are short, and a
        trial needs that fit to be judged against."""
        if not self._young_look:
            return False
        fit = engine.analysis.fit(engine.s.kv)
        return fit is not None and fit.samples >= MIN_OWN_FIT_SAMPLES

    def probes_pay(self) -> bool:
        """A side-cache probe costs 3-8 s of the swarm's time on these 2-core CPUs (two prefilled histories
        per type): worth it in a run of unknown length (the dashboard, serve) or a long one, not in a short
        one, where a trial on the swarm itself (two conversions of well under a second) costs less."""
        return self.goal.run_s is None or self.goal.run_s >= PROBE_MIN_RUN_S

    def prepare(self, engine: Engine) -> list[TuneEvent]:
        """At the run's start, before its first step (a real backend): time the allowed KV types in a side
        cache, then take the first look at once: a KV switch costs nothing while the caches are empty."""
        if engine.backend.source == "simulated" or self._looked:
            return []
        if self._epoch_start_s is None:
            self._epoch_start_s = engine.now_s()
        if not self.probes_pay():
            return []  # a short run: the other KV types are tried on the swarm instead (a trial, converted)
        out = self._probe_missing(engine, self.setting(engine))
        if self._simulator(engine) is not None:
            # planning before the swarm starts, as the probe is: on the run's clock, but not counted against
            # the share of it the tuner may think while the swarm runs
            thought = self._thought_s
            out += self._look(engine, engine.now_s(), kv_only=True)
            self._thought_s = thought
        return out

    def _look(self, engine: Engine, now: float, kv_only: bool = False) -> list[TuneEvent]:
        """Forecast staying (checked later against what comes) and, past the dwell, decide. kv_only: weigh
        only the KV types (a look before the first step: the one lever whose switch then costs nothing and
        later a re-prefill; a cap or residency is as cheap to change at the next look)."""
        out: list[TuneEvent] = []
        self._looked = True
        self._epoch_start_s = now
        self._young_look = False
        # it has thought enough for now: the engine's cores are for decoding. An average over the run with an
        # epoch's credit: without it, one look early in a run (0.45 s at 10 s on one thread) skipped the next
        # three, and a short run went by on one look
        if engine.backend.source != "simulated" and (
                self._thought_s > self.goal.think_share * (max(now, 1.0) + self.goal.epoch_s)):
            return out
        if self.goal.run_s is not None and self.goal.run_s - now < self.goal.epoch_s:
            return out  # less than an epoch left: no change could pay for itself, nor a forecast be checked
        cur = self.setting(engine)
        t0 = time.perf_counter()
        base = self.forecast(engine, cur)  # every epoch: the forecast of staying, checked as it unfolds
        if base is not None and all(run[-1].seconds > 0 for run in base):
            self._checks.append((self._objectives(base), SpanTally(now, self.spans_for(self.horizon_at(now))), cur))
        left_s = math.inf if self.goal.run_s is None else self.goal.run_s - now
        if now - self._last_change_s >= self.goal.dwell_s and base is not None and left_s >= LAST_CHANGE_EPOCHS * \
                self.goal.epoch_s:
            pending = (self._pending, self._pending_tally)
            decision = self._decide(engine, cur, base, kv_only)
            if decision is not None:
                self._drop_moved_checks(engine)
                if pending[0] is not None:  # the last decision's outcome: over the spans that passed before this one
                    out.append(self._measured(engine, *pending))
                out.append(decision)
        if not out and engine.backend.source != "simulated":
            fit = engine.analysis.fit(cur.kv)
            self._young_look = fit is None or fit.samples < MIN_OWN_FIT_SAMPLES
        self._thought_s += time.perf_counter() - t0
        return out

    def _drop_moved_checks(self, engine: Engine) -> None:
        """A forecast of staying says nothing of what came after the setting moved (a decision, or a person):
        its spans not yet closed are dropped, not compared."""
        now_setting = self.setting(engine)
        self._checks = [c for c in self._checks if c[2] == now_setting]

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

    def _close_checks(self) -> None:
        """Forecasts of staying whose spans have passed: their errors, measured, are the tuner's stated error."""
        keep = []
        for forecast, came, setting in self._checks:
            while len(came.closed) > (done := came.checked):
                measured = came.closed[done].objective_value(self.goal)
                predicted = forecast[done]
                if predicted and measured:
                    self._errors[done] = (self._errors.get(done, []) + [predicted / measured - 1])[-32:]
                came.checked = done + 1
            if len(came.closed) < len(came.spans):
                keep.append((forecast, came, setting))
        self._checks = keep

    def stated_error(self, span: int | None = None) -> float | None:
        """How far a forecast gain over a span may be from the measured one: twice the rms error of the
        forecasts of staying checked over that span (about 95% of them fall inside), or over the longest
        shorter span with 3 checks (noisier, so wider). None until 3 forecasts were checked. span: its
        index (k+1 epochs); by default the default horizon's last."""
        k = len(self.spans) - 1 if span is None else span
        for j in range(k, -1, -1):
            errs = self._errors.get(j, [])
            if len(errs) >= 3:
                return 2 * math.sqrt(sum(e * e for e in errs) / len(errs))
        return None

    def forecast_error(self, span: int) -> float:
        """The error a move's gain must clear over a span: the rms error measured on this run's forecasts of
        staying (half the stated error an outcome is judged against, which is a 95% band), or the prior
        until three were checked."""
        err = self.stated_error(span)
        return self.goal.prior_error if err is None else err / 2

    def _error_source(self, span: int) -> str:
        if self.stated_error(span) is None:
            return "prior: fewer than 3 forecasts of staying checked yet (Goal.prior_error)"
        return "rms error of this run's checked forecasts of staying (measured)"

    def _check_watch(self, engine: Engine, rec: StepRecord) -> list[TuneEvent]:
        """The closed loop: each step of the last change against what its forecast's model said it costs;
        a change measurably worse than staying is reverted, and remembered for these conditions."""
        if self._watch is None or rec.kind == "tune":
            return []
        w, back, to = self._watch
        cur = self.setting(engine)
        if cur != to:
            self._watch = None  # a person (or a refused build) moved the setting: nothing left to check
            return []
        if rec.kv_type != w.kv:
            return []  # a step from before the switch took effect
        w.add(rec)
        if not w.ready:
            return []
        if to.kv != back.kv and w.model.calibrated:
            # a KV type's model is corrected by what its decode and prefill steps measured, and the rest of
            # the run forecast again both ways: its budget and preemptions are the forecast's to count
            if w.decode_steps < MIN_STEPS * 2 ** w.checks:  # each re-forecast on twice the steps of the last
                return []
            gain = self._corrected_gain(engine, w, to, back)
            w.checks += 1
            if gain is None:
                return []
            # once a switch is made, staying costs nothing and going back costs a conversion: the margin was
            # the bar for making it; what keeps it is a corrected forecast no worse than going back
            if gain[2] >= 0.0:
                return self._confirm(engine, w, back, to, gain)
            if gain[1] < -TOLERANCE or (w.trial and gain[0] < 0.0):
                return self._revert(engine, w, back, to, gain)
            if w.checks >= (TRIAL_CHECKS if w.trial else MAX_CHECKS):
                # neither way past its noise: it holds, and the forecasts take it from here
                self._watch = None
                return [Held(to=to, q=_round(w.q), measured_gain=round(gain[0], 4),
                             why=f"tune check: {to.label()} holds, neither measurably better nor worse: "
                                 f"{w.describe(gain)}")]
            return []
        if w.confirmed():
            return self._confirm(engine, w, back, to, w.realised_gain())
        if w.worse():
            return self._revert(engine, w, back, to, w.realised_gain())
        return []

    def _corrected_gain(self, engine: Engine, w: Watch, to: Setting,
                        back: Setting) -> tuple[float, float, float] | None:
        """(gain, favourable end, unfavourable end) of staying at `to` over going back, forecast over what is
        left of the horizon with `to`'s KV model scaled by what its steps measured."""
        t0 = time.perf_counter()
        (qd, qd_fav, qd_unf), (qp, qp_fav, qp_unf) = w.decode.bounds(), w.prefill.bounds()
        seeds = range(self.goal.forecast_seeds)
        n = len(engine.agents)
        stay = self.forecast(engine, back, seeds)
        out = []
        for dec, pre in ((qd, qp), (qd_fav, qp_fav), (qd_unf, qp_unf)):
            runs = self.forecast(engine, to, seeds, correct={to.kv: w.correction(to.kv, dec, pre)})
            if runs is None or stay is None:
                return None
            score_new = sum(r[-1].score(self.goal, n) for r in runs) / len(runs)
            score_old = sum(r[-1].score(self.goal, n) for r in stay) / len(stay)
            g = _gain(score_new, score_old)
            if g is None:
                return None
            out.append(g)
        self._thought_s += time.perf_counter() - t0
        return out[0], out[1], out[2]

    def _confirm(self, engine: Engine, w: Watch, back: Setting, to: Setting, gain) -> list[TuneEvent]:
        self._watch = None
        if to.kv != back.kv and w.model.calibrated:
            # its model, corrected by what it measured, stands until its own fit does
            self._kv_correction[to.kv] = w.correction(to.kv)
        return [Confirmed(to=to, q=_round(w.q), trial=w.trial,
                          measured_gain=None if gain is None else round(gain[0], 4),
                          why=f"tune check: {to.label()} holds: {w.describe(gain)}")]

    def _check_outcome(self, engine: Engine) -> list[TuneEvent]:
        """The closed loop on the objective itself: what the change measured so far (past OUTCOME_MIN_SPANS
        epochs) against the forecast of staying over the same span. Measurably below it, past the error
        stated for that span, it goes back: a forecast can be wrong in more than its step times (how the
        budget fills, what a preemption costs). Not once the turns changed shape: that forecast was of
        another swarm."""
        p, came = self._pending, self._pending_tally
        if p is None or came is None or self.setting(engine) != p.to:
            return []
        if turn_shape(engine) != p.shape:
            # the swarm's turns changed shape since: its forecast of staying was of other turns, and what
            # the objective did since is theirs as much as the setting's (a workload that went from reading
            # to writing measured -72% "against staying" here). The step-time check still judges it.
            return []
        o = self._measured(engine, p, came)
        gain, stated = o.measured_gain, o.stated_error
        if gain is None or stated is None or gain + stated >= -TOLERANCE:
            return []
        self._pending, self._pending_tally = None, None
        back, cur = p.from_, p.to
        gone = self._go_back(engine, back, cur)
        if isinstance(gone, RevertRefused):
            return [o, gone]
        return [o, Reverted(from_=cur, to=back, measured_gain=gain, mean_context=round(gone, 1), stated_error=stated,
                            source=f"{engine.backend.source} objective against the forecast of staying",
                            why=f"tune check: {cur.label()} is measurably worse than staying: {gain:+.1%} over "
                                f"{o.span_s:.0f} s against the forecast of staying (error ±{stated:.0%}, measured); "
                                f"back to {back.label()}, not tried again until the contexts or the budget move")]

    def _go_back(self, engine: Engine, back: Setting, cur: Setting, q: float = 1.0) -> float | RevertRefused:
        """Back to the setting a change left, remembered as worse under these conditions: the mean context
        it left at, or why the swarm refused."""
        ctx = [a.context for a in engine.agents]
        mean_ctx = mean_context(ctx)
        self._watch = None
        try:
            engine.request(Control(batch_cap=back.batch_cap if back.batch_cap != cur.batch_cap else None,
                           kv=back.kv if back.kv != cur.kv else None,
                           residency=back.residency if back.residency != cur.residency else None))
        except UserError as e:  # the swarm changed under it: nothing to go back to
            return RevertRefused(to=back, why=f"tune check: {e}")
        self._penalties[cur] = (mean_ctx, engine.s.kv_budget_bytes, q, turn_shape(engine))
        self._last_change_s = engine.now_s()
        self._left_at_context[cur] = mean_ctx
        self._drop_moved_checks(engine)
        return mean_ctx

    def _revert(self, engine: Engine, w: Watch, back: Setting, cur: Setting, gain) -> list[TuneEvent]:
        # the outcome so far, over the spans that passed (none yet: nothing to say, and it is dropped)
        mine = self._pending is not None and self._pending.to == cur
        closed = self._pending_tally is not None and bool(self._pending_tally.closed)
        out = [self._measured(engine)] if mine and closed else []
        if mine and not closed:
            self._pending, self._pending_tally = None, None
        gone = self._go_back(engine, back, cur, w.q or 1.0)
        if isinstance(gone, RevertRefused):
            return [*out, gone]
        mean_ctx = gone
        if cur.kv != back.kv and w.model.calibrated:
            self._kv_correction[cur.kv] = w.correction(cur.kv)
        worse = gain is None or gain[1] < -TOLERANCE
        what = "measurably worse than staying" if worse else "a trial measured below going back"
        return [*out, Reverted(from_=cur, to=back, q=_round(w.q), q_stderr=_round(w.q_stderr),
                               decode_steps=w.decode_steps, trial=w.trial,
                               measured_gain=None if gain is None else round(gain[0], 4),
                               mean_context=round(mean_ctx, 1),
                               source=f"{engine.backend.source} steps against the forecast's step-time model",
                               why=f"tune check: {cur.label()} is {what}: {w.describe(gain)}; back to "
                                   f"{back.label()}, not tried again until the contexts or the budget move")]

    def _penalised(self, engine: Engine, s: Setting, mean_ctx: float) -> bool:
        """A setting reverted as worse, under conditions that have not moved since: the contexts, the budget
        and the shape of the turns (what a turn generates and what its tool result adds)."""
        p = self._penalties.get(s)
        if p is None:
            return False
        ctx, budget, _, shape = p
        moved = abs(mean_ctx - ctx) >= PENALTY_CONTEXT_CHANGE * max(ctx, REVISIT_MIN_CONTEXT)
        return not moved and budget == engine.s.kv_budget_bytes and shape == turn_shape(engine)

    @staticmethod
    def setting(engine: Engine) -> Setting:
        st = engine.state()
        return Setting(st.batch_cap, st.kv, st.residency)

    def _learn(self, rec: StepRecord) -> None:
        if rec.source != "measured":
            return
        if rec.kind == "prefill" and rec.seconds > 0 and rec.tokens and rec.batch_ids:
            after = next((a.context for a in rec.agents if a.id == rec.batch_ids[0]), None)
            if after is not None:
                self._prefill.setdefault(rec.kv_type, PrefillCalibration()).add(rec.tokens, after - rec.tokens,
                                                                                 rec.seconds)
        for m in rec.moved:
            if m.op in ("swap_out", "swap_in") and m.seconds > 0:
                self._swap = (self._swap + [(m.bytes, m.seconds)])[-64:]
            if m.op == "convert" and m.seconds > 0:
                self._convert = (self._convert + [(m.bytes, m.seconds)])[-64:]

    def _probe_missing(self, engine: Engine, cur: Setting) -> list[TuneEvent]:
        """Times each allowed KV type that has not run against the run's own, once per run, at the widest
        batch a candidate can have: a forecast of switching to it needs its step time on this machine."""
        out: list[TuneEvent] = []
        kvs = {c.kv for c in self.candidates(engine, cur)} - {cur.kv} - set(self._probes)
        ctx = [a.context for a in engine.agents]
        for k in sorted(kvs):
            if (own := engine.analysis.fit(k)) is not None and own.samples >= MIN_OWN_FIT_SAMPLES:
                continue
            long = long_context(mean_context(ctx), engine.s.ctx_per_agent)
            try:
                p = probe_kv(engine.backend, cur.kv, k, len(engine.agents), long)
            except (UserError, NoKVSlot, RuntimeError, ValueError) as e:
                self._probes[k] = None
                if isinstance(e, UserError):  # this build cannot make a cache of that type: not a candidate
                    engine.refused_kv.add(k)
                out.append(Probed(kv=k, base_kv=cur.kv, error=str(e),
                                  why=f"tune: KV {k} could not be timed in a side cache ({e}); "
                                      + ("it is no candidate" if isinstance(e, UserError) else
                                         f"its forecasts borrow KV {cur.kv}'s step time, unscaled")))
                continue
            self._probes[k] = p
            bm = engine.facts.bytes_model
            # what the side caches timed joins each type's fit as steps of the run do, fading as they do: at
            # the start they are all there is; they are not counted in the run's prequential error
            for kv, points in p.decode.items():
                cal = engine.analysis.calibration(kv)
                for batch, context, seconds in points:
                    longest = bm.kv_equivalent_tokens(kv, context)
                    cal.add(batch, batch * longest, seconds, longest=longest, checked=False)
                cal.refit()
            for kv, chunks in p.prefill.items():
                for tokens, pos0, seconds in chunks:
                    self._prefill.setdefault(kv, PrefillCalibration()).add(tokens, pos0, seconds, pinned=True)
            fixed, per_token = p.ratios
            what = (f"attention {per_token:.2f}x per token, the rest {fixed:.2f}x" if p.split else
                    f"the whole step {fixed:.2f}x (attention too small here to time apart)")
            figures = {k: v for k, v in p.record().items() if k not in ("kv", "base_kv")}
            out.append(Probed(kv=p.kv, base_kv=p.base_kv, figures=figures,
                              why=f"tune: timed KV {k} against {cur.kv} in a side cache ({p.wall_s:.1f} s, batch "
                                  f"{p.batch}, contexts {p.contexts[0]} and {p.contexts[1]}): {what} (measured)"))
        return out

    def step_time_source(self, engine: Engine, kv: str) -> str:
        """Where a forecast's step times at this KV type come from."""
        own = engine.analysis.fit(kv)
        p = self._probes.get(kv)
        if own is not None and (own.samples >= MIN_OWN_FIT_SAMPLES or p is None):
            return f"fitted on this run's {own.samples} steps at {kv}"
        if p is not None and engine.analysis.fit(p.base_kv) is not None:
            return f"KV {p.base_kv}'s fit scaled by a side-cache probe of both (modeled from measured ratios)"
        return "borrowed from another KV type's fit, unscaled (never timed at this type)"

    # the candidates: one lever at a time, a step away
    def candidates(self, engine: Engine, cur: Setting) -> list[Setting]:
        n = len(engine.agents)
        caps = sorted({max(1, cur.batch_cap // 2), min(n, cur.batch_cap * 2), n} - {cur.batch_cap})
        kvs = [k for k in (self.goal.allowed_kv or (engine.s.kv,)) if k != cur.kv]
        out = [replace(cur, batch_cap=c) for c in caps]
        out += [replace(cur, kv=k) for k in kvs]
        out += [replace(cur, residency=r) for r in RESIDENCY if r != cur.residency]
        out = [c for c in out if c.kv not in engine.refused_kv]
        ctx = [a.context for a in engine.agents]
        mean_ctx = mean_context(ctx)
        out = [c for c in out if not self._penalised(engine, c, mean_ctx)]
        if engine.s.kv_budget_bytes is not None:  # a type whose budget cannot hold one agent is no candidate
            out = [c for c in out if engine.budget_tokens(c.kv) >= min_context(engine.s)]
        return out

    def forecast(self, engine: Engine, setting: Setting, seeds: range | None = None,
                 correct: dict[str, tuple[Fit, PrefillFit | None]] | None = None) -> list[list[Tally]] | None:
        """One run forward per forecast seed (common to every candidate, so they differ by the setting and
        not by luck); None if any of them could not run."""
        runs = [self._forecast_once(engine, setting, k, correct) for k in (seeds or range(self.goal.forecast_seeds))]
        done = [r for r in runs if r is not None]
        return None if len(done) < len(runs) else done

    def _forecast_once(self, engine: Engine, setting: Setting, k: int,
                       correct: dict[str, tuple[Fit, PrefillFit | None]] | None = None) -> list[Tally] | None:
        """Run the swarm forward from now under `setting` in a simulator: what each span up to the horizon
        would hold (the last is the whole horizon); None where the simulator cannot run the swarm that way."""
        sim = self._simulator(engine, correct)
        if sim is None:
            return None
        s = replace(engine.s, batch_cap=min(setting.batch_cap, len(engine.agents)), residency=setting.residency,
                    check=False, seed=engine.s.seed + FORECAST_SEED_SALT * (k + 1),
                    agents=len(engine.agents))
        shadow = engine.fork(sim, s, meter=self._meter(engine))
        if setting.kv != engine.s.kv:
            try:
                shadow.request(Control(kv=setting.kv))
            except UserError:  # the budget holds too little at that type
                return None
        start = engine.now_s()
        horizon = self.horizon_at(start)
        tally = SpanTally(start, self.spans_for(horizon))
        end = start + horizon
        steps = 0
        while shadow.now_s() < end and steps < 200_000:
            try:
                r = shadow.step()
            except (Stalled, UserError):  # the budget cannot run the swarm this way: not a candidate (a
                # CacheMismatch, the engine's own bug, is not caught: it fails the run that met it)
                return None
            tally.add(r)
            steps += 1
        return tally.finish()

    def _simulator(self, engine: Engine, correct: dict[str, tuple[Fit, PrefillFit | None]] | None = None
                   ) -> SimBackend | None:
        """correct: per KV type, the step-time and prefill models to forecast it with instead."""
        b = engine.backend
        if isinstance(b, SimBackend):  # the card as its profile states it (the card itself, unless mis-stated)
            return SimBackend(b.stated)
        own = {kv: fit for kv in KV_TYPES if (fit := engine.analysis.fit(kv)) is not None}
        prefills = {kv: c.fit for kv, c in self._prefill.items() if c.fit is not None}
        if not own or not prefills:
            return None  # nothing measured yet to simulate this machine with
        fits = dict(own)
        for kv, p in self._probes.items():
            young = kv not in own or own[kv].samples < MIN_OWN_FIT_SAMPLES
            if p is not None and young and p.base_kv in own:
                fits[kv] = p.scale(own[p.base_kv])
        # a type tried on the swarm: its model corrected by what its steps measured, until its own fit stands
        for kv, (fit, pre) in {**self._kv_correction, **(correct or {})}.items():
            if kv not in own or own[kv].samples < MIN_OWN_FIT_SAMPLES or kv in (correct or {}):
                fits[kv] = fit
                if pre is not None:
                    prefills[kv] = pre
        now_prefill = prefills.get(engine.s.kv) or next(iter(prefills.values()))
        swap_bw = (sum(b for b, _ in self._swap) / sum(s for _, s in self._swap)) if self._swap else 10e9
        f = engine.facts
        prof = Profile(name="calibrated", description="this run, calibrated", model_name=f.name,
                    weight_bytes=f.weight_bytes, kv_bytes_per_token_f16=f.bytes_model.kv_bytes_per_token("f16"),
                    effective_bandwidth_bytes_per_s=1.0, compute_seconds_per_token=0.0,
                    prefill_tokens_per_s=1 / now_prefill.per_token_seconds,
                    kv_budget_bytes=engine.s.kv_budget_bytes or 0.0,
                    context_per_agent=engine.s.ctx_per_agent, n_ctx_train=f.n_ctx_train, power_floor_watts=0.0,
                    power_per_agent_watts=0.0, source="calibrated on this run (modeled)", layers=f.bytes_model,
                    host_link_bytes_per_s=swap_bw)
        return CalibratedSim(prof, fits, prefills, engine.s.kv)

    def _meter(self, engine: Engine):
        m = engine.meter
        if isinstance(m, ModeledMeter):
            return ModeledMeter(m.floor_watts, m.per_agent_watts)
        return NoMeter("forecast: no power model")

    def _decide(self, engine: Engine, cur: Setting, base: list[list[Tally]], kv_only: bool = False) -> Decision | None:
        n = len(engine.agents)
        if any(run[-1].seconds <= 0 for run in base):
            return None
        ctx = [a.context for a in engine.agents]
        mean_ctx = mean_context(ctx)
        candidates = [c for c in self.candidates(engine, cur) if not kv_only or c.kv != cur.kv]
        forecasts = {c: f for c in candidates if (f := self.forecast(engine, c)) is not None}
        if not forecasts:
            return None

        def score(runs: list[list[Tally]]) -> float:
            return sum(run[-1].score(self.goal, n) for run in runs) / len(runs)

        best = max(forecasts, key=lambda c: score(forecasts[c]))
        base_score = score(base)
        gain = _gain(score(forecasts[best]), base_score)
        # the forecast's own spread: how far apart its seeds put the gain
        per_seed = [_gain(h[-1].score(self.goal, n), b[-1].score(self.goal, n)) for h, b
                    in zip(forecasts[best], base, strict=True)]
        spread = _spread(per_seed)
        # a gain inside the forecast's own spread is luck, not the setting; one inside the model's own error,
        # measured on this run's forecasts of staying over the same span, is not a gain the model can see
        horizon = self.horizon_at(engine.now_s())
        error = self.forecast_error(len(self.spans_for(horizon)) - 1)
        trial = False
        if gain is None or spread is None or gain < self.goal.margin + max(spread, error):
            # its model may not judge a KV type it extrapolates: where trying it on the swarm is cheap, try it
            tried = self._trial(engine, cur, forecasts, base, error, horizon)
            if tried is None:
                return None
            best, trial, gain = tried, True, _gain(score(forecasts[tried]), base_score) or 0.0
        # hysteresis: back to a setting it left only once the contexts have moved and for twice the margin
        elif cur is not best and best in self._left_at_context and (
                gain < 2 * self.goal.margin or not self._may_return(best, mean_ctx)):
            return None
        # chosen on some draws, judged on others: the gain it states is not the luck that picked it. With one
        # candidate nothing was picked among several (no winner's curse), and its draws judge it as fresh ones
        # would: the look before the first step, weighing one other KV type, saves the confirming forecasts
        fresh = range(self.goal.forecast_seeds, self.goal.forecast_seeds + self.goal.confirm_seeds)
        if self.goal.confirm_seeds > 0 and len(forecasts) > 1 and not trial:
            new_runs, stay_runs = self.forecast(engine, best, fresh), self.forecast(engine, cur, fresh)
            if new_runs is None or stay_runs is None:
                return None
            gain = _gain(score(new_runs), score(stay_runs))
            need = 2 * self.goal.margin if best in self._left_at_context else self.goal.margin
            # as on the draws that chose it: a gain inside the draws' own spread is luck, not the setting
            fresh_spread = _spread([_gain(h[-1].score(self.goal, n), b[-1].score(self.goal, n))
                                    for h, b in zip(new_runs, stay_runs, strict=True)])
            if gain is None or fresh_spread is None or gain < need + max(fresh_spread, error):
                return None
        else:
            new_runs, stay_runs = forecasts[best], base
        try:
            engine.request(Control(batch_cap=best.batch_cap if best.batch_cap != cur.batch_cap else None,
                           kv=best.kv if best.kv != cur.kv else None,
                           residency=best.residency if best.residency != cur.residency else None))
        except UserError:  # the swarm changed under it (agents removed meanwhile): look again next epoch
            return None
        now = engine.now_s()
        self._last_change_s = now
        self._left_at_context[cur] = mean_ctx
        # the outcome is measured over the spans that pass before the horizon (or the next decision), each
        # against the forecasts of that same span
        self._pending = Pending(from_=cur, to=best, predicted_gain=gain, spread=spread,
                                predicted_old=self._objectives(stay_runs), predicted_new=self._objectives(new_runs),
                                draws=self._draw_spreads(new_runs, stay_runs), shape=turn_shape(engine))
        self._pending_tally = SpanTally(now, self.spans_for(horizon))
        sim = self._simulator(engine)
        self._watch = (Watch(best.kv, gain, SimStepCost(sim), trial=trial), cur, best) if sim is not None else None
        if trial:
            self._tried[best.kv] = (mean_ctx, turn_shape(engine))
        what = ", ".join(f"{k} {getattr(cur, k)} -> {getattr(best, k)}" for k in ("batch_cap", "kv", "residency")
                         if getattr(cur, k) != getattr(best, k))
        return Decision(
            from_=cur, to=best, objective=self.goal.objective, predicted_gain=round(gain, 4),
            predicted_gain_source="modeled", trial=trial, forecast_spread=None if spread is None else round(spread, 4),
            horizon_s=round(horizon, 1), mean_context=round(mean_ctx, 1), forecast_error=round(error, 4),
            forecast_error_source=self._error_source(len(self.spans_for(horizon)) - 1),
            kv_step_time_source=self.step_time_source(engine, best.kv)
            if best.kv != cur.kv and engine.backend.source != "simulated" else None,
            why=(f"tune trial: {what}: forecast {gain:+.1%} {self.goal.objective} over {horizon:.0f} s, "
                 f"within its error ±{error:.0%}; its model of KV {best.kv} is a probe's, extrapolated here, "
                 "so it is tried on the swarm and kept only if, forecast again with its measured steps, it "
                 "is not below going back")
            if trial else
            f"tune: {what}: forecast {gain:+.1%} {self.goal.objective} over the next "
            f"{horizon:.0f} s (modeled), past its error ±{error:.0%} and the margin")

    def _trial(self, engine: Engine, cur: Setting, forecasts: dict, base: list[list[Tally]], error: float,
               horizon: float) -> Setting | None:
        """A KV type worth trying on the swarm itself: its model is a probe's scaled at short contexts (or an
        earlier trial's at half these), the swarm's contexts are past what that timed, its forecast cannot
        rule out a gain, a switch converts the caches in place, and what the trial may cost (two switches
        and its steps at half speed) is at most TRIAL_SHARE of what is left of the horizon."""
        if engine.backend.source == "simulated" or not engine.s.kv_convert:
            return None  # the sim's model is the card itself; without conversion a trial costs a re-prefill
        n = len(engine.agents)
        ctx = [a.context for a in engine.agents]
        mean_ctx = mean_context(ctx)
        bm = engine.facts.bytes_model
        fit = engine.analysis.fit(cur.kv)
        if fit is None or fit.samples < MIN_OWN_FIT_SAMPLES:
            # a trial is judged against the run's own type's model: on its first few steps that model can be
            # off by 2x (an AVX2 CPU's q8_0 trial measured 0.49x of it, and held, where q8_0 is 0.7x f16)
            return None
        batch = min(cur.batch_cap, n)
        step_s = fit.step_seconds(batch, bm.kv_equivalent_tokens(cur.kv, mean_ctx) * batch)
        cached = sum(bm.kv_cache_bytes(cur.kv, c) for c in ctx)
        # a conversion's measured rate covers its save and convert; the restore costs about as much again
        rate = sum(b for b, _ in self._convert) / (2 * sum(s for _, s in self._convert)) if self._convert else 0.25e9
        cost = 2 * cached / rate + 2 * MIN_STEPS * step_s * TRIAL_LOSS
        if cost > TRIAL_SHARE_UNTIMED * horizon:
            return None
        base_score = sum(r[-1].score(self.goal, n) for r in base) / len(base)
        out: list[tuple[float, Setting]] = []
        for c, runs in forecasts.items():
            if c.kv == cur.kv or c.batch_cap != cur.batch_cap or c.residency != cur.residency:
                continue
            own = engine.analysis.fit(c.kv)
            if own is not None and own.samples >= MIN_OWN_FIT_SAMPLES:
                continue  # timed on this run's own steps: its forecast stands
            p = self._probes.get(c.kv)
            tried = self._tried.get(c.kv)
            timed_at = tried[0] if tried is not None else float(p.contexts[1]) if p is not None else 0.0
            if tried is not None and tried[1] != turn_shape(engine):
                timed_at = 0.0  # the turns changed shape since (longer answers, shorter tool results): try again
            if mean_ctx < 2 * timed_at or engine.backend.can_convert(cur.kv, c.kv) is not None:
                continue
            untimed = p is None and tried is None and own is None
            if cost > (TRIAL_SHARE_UNTIMED if untimed else TRIAL_SHARE) * horizon:
                continue
            g = _gain(sum(r[-1].score(self.goal, n) for r in runs) / len(runs), base_score)
            if g is not None and g > -error:
                out.append((g, c))
        return max(out, key=lambda x: x[0])[1] if out else None

    def _may_return(self, s: Setting, mean_ctx: float) -> bool:
        """Hysteresis: back to a setting it left only once the contexts have moved since it left it."""
        left = self._left_at_context.get(s)
        return left is None or abs(mean_ctx - left) >= self.goal.revisit_context_change * max(left, REVISIT_MIN_CONTEXT)

    def _draw_spreads(self, new_runs: list[list[Tally]],
                      stay_runs: list[list[Tally]]) -> list[tuple[float | None, int]]:
        """Per span: the standard deviation of the forecast gain across the forecast's draws, and how many."""
        out: list[tuple[float | None, int]] = []
        for k in range(len(new_runs[0])):
            gains = [self._objective_gain(h[k].objective_value(self.goal), b[k].objective_value(self.goal))
                     for h, b in zip(new_runs, stay_runs, strict=True)]
            vals = [g for g in gains if g is not None]
            out.append((statistics.stdev(vals) if len(vals) >= 2 else None, len(vals)))
        return out

    def outcome_now(self, engine: Engine) -> Outcome | None:
        """The pending decision's outcome over the spans that have passed, if one is pending: what a run
        that ends before the horizon can still say about its last decision."""
        if self._pending is None or self._pending_tally is None or not self._pending_tally.closed:
            return None
        return self._measured(engine)

    def _objective_gain(self, new: float | None, old: float | None) -> float | None:
        """The gain in the objective's own unit: more tok/s, or fewer J/token."""
        if not new or not old:
            return None
        return (old / new - 1) if self.goal.objective == "joules_per_token" else (new / old - 1)

    def _measured(self, engine: Engine, p: "Pending | None" = None, came: SpanTally | None = None) -> Outcome:
        """A decision's outcome over the longest span that has passed: the measured objective against the
        forecast of staying, next to the forecast gain for that span and the error stated for it. By
        default the pending decision's, which it closes; else the one given (a later decision replaced it)."""
        if p is None:
            p, came = self._pending, self._pending_tally
            self._pending, self._pending_tally = None, None
        assert p is not None and came is not None
        k = len(came.closed) - 1
        span_s = came.spans[k] if came is not None and k >= 0 else 0.0
        measured_new = came.closed[k].objective_value(self.goal) if k >= 0 else None
        old = p.predicted_old[k] if k >= 0 else None
        predicted = self._objective_gain(p.predicted_new[k], old) if k >= 0 else None
        gain = self._objective_gain(measured_new, old)
        err = None
        predicted_new = p.predicted_new[k] if k >= 0 else None
        if measured_new and predicted_new:
            err = predicted_new / measured_new - 1
        stated = self.stated_error(k) if k >= 0 else None
        draw_sd, n_draws = p.draws[k] if k >= 0 else (None, 0)
        if stated is not None and draw_sd is not None:
            # the gain's own luck: this future is one more draw from the forecast's spread of them
            stated = math.sqrt(stated ** 2 + (2 * draw_sd) ** 2 * (1 + 1 / n_draws))
        judged = verdict(gain, predicted, stated)
        agrees = None if judged in (None, "inconclusive") else judged == "agrees"
        return Outcome(
            from_=p.from_, to=p.to, objective=self.goal.objective, predicted_gain=round(p.predicted_gain, 4),
            span_s=span_s, predicted_gain_span=_round(predicted),
            forecast_spread=None if p.spread is None else round(p.spread, 4),
            measured_gain=None if gain is None else round(gain, 4), stated_error=_round(stated), agrees=agrees,
            verdict=judged,
            measured_gain_source=f"{engine.backend.source} new setting vs the forecast of staying (modeled)",
            stated_error_source=f"2 x rms error of this run's forecasts of staying over {span_s:.0f} s "
                                f"({engine.backend.source}), with 2 x the spread of this forecast's own draws "
                                "(modeled)",
            forecast_error=None if err is None else round(err, 4),
            why=f"tune outcome: {p.to.label()}: forecast "
                + ("n/a" if predicted is None else f"{predicted:+.1%}") + f" over {span_s:.0f} s, measured "
                + ("n/a" if gain is None else f"{gain:+.1%}") + " against staying"
                + ("" if stated is None else f" (stated error ±{stated:.0%}: {_VERDICT_WORDS[judged]})"))


@dataclass
class Pending:
    """A decision whose outcome is being measured: what it forecast for each span, both ways."""

    from_: Setting
    to: Setting
    predicted_gain: float
    spread: float | None
    predicted_old: list[float | None]  # the forecast objective of staying, per span
    predicted_new: list[float | None]  # and of the change
    draws: list[tuple[float | None, int]]  # per span: the spread of the forecast's draws and how many
    shape: tuple[int, int]  # the turns' shape the forecasts ran on (turn_shape)


_VERDICT_WORDS = {"agrees": "agrees", "disagrees": "disagrees",
                  "inconclusive": "inconclusive, larger than the gain it judges", None: "n/a"}


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


def turn_shape(engine: Engine) -> tuple[int, int]:
    """What a turn generates and what its tool result adds: the workload's shape, which the forecasts take
    from the engine's settings, and which can change while the swarm runs."""
    return engine.s.gen_tokens, engine.s.tool_tokens

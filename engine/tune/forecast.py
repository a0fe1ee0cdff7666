"""Forecasting: the swarm run forward from now in a simulator, under a setting, span by span to the horizon.

Each forecast is a shadow of the live engine (engine/tune/shadow.py) on the simulator what it learned of
this machine makes (engine/tune/measured.py: the stated card on the sim backend, a simulator calibrated on
this run's own steps on a real one), with the step-time factors experiments measured laid over it. The
forecasts run on the engine's own thread: the thinking they cost is counted here, in the tuner's Spending,
and held to the goal's share of the run.

Forecasts draw tool latencies from their own stream: the tuner does not know the future."""

import math
import time
from collections.abc import Iterable
from dataclasses import replace

from swarmtune.engine.backends.sim_backend import SimBackend, StepScale
from swarmtune.engine.control import Control
from swarmtune.engine.engine_view import EngineView
from swarmtune.engine.errors import Stalled, UserError
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.measure.power.meter import Meter, ModeledMeter, NoMeter
from swarmtune.engine.settings import cap_in_force
from swarmtune.engine.tune.cost import Spending
from swarmtune.engine.tune.experiment import Experiment
from swarmtune.engine.tune.goal import Goal, Setting
from swarmtune.engine.tune.measured import MIN_OWN_FIT_SAMPLES, Measured
from swarmtune.engine.tune.shadow import shadow_of
from swarmtune.engine.tune.tally import SpanTally, Tally

FORECAST_SEED_SALT = 7919  # the forecast's tool latencies come from another stream than the run's
YIELD_EVERY_STEPS = 64  # how often a forecast looks whether a pause wants the engine thread

Runs = list[list[Tally]]  # one forecast: per seed, what each span held


class Forecaster:
    def __init__(self, goal: Goal, measured: Measured, cost: Spending) -> None:
        self.goal = goal
        self.measured = measured
        self.cost = cost  # the tuner's: forecasts and the thinking they cost are counted in it
        # per KV type, what an experiment measured of its steps against the model: later forecasts run on it
        # (until, on a real backend, the type has a fit of its own steps)
        self.measured_scale: dict[KVSetting, StepScale] = {}

    # thinking
    def thinking_spent(self, now: float) -> bool:
        """It has thought enough for now: the engine's thread is the swarm's. An average over the run with an
        epoch's credit (one look early in a run would otherwise skip the next three)."""
        return self.cost.think_s > self.goal.think_share * (max(now, 1.0) + self.goal.epoch_s)

    def think(self, engine: EngineView, t0: float, c0: float, forecasts: int) -> None:
        """What a look's forecasts held the swarm up: wall seconds on a real backend (measured); on the sim,
        whose clock does not wait for them, Goal.sim_think_s per forecast (modeled)."""
        self.cost.think_cpu_s += time.thread_time() - c0
        if engine.backend.source == "simulated":
            self.cost.think_s += self.goal.sim_think_s * forecasts
        else:
            self.cost.think_s += time.perf_counter() - t0

    # spans
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

    def objectives(self, runs: Runs) -> list[float | None]:
        """The forecast objective at each span, averaged over the forecast's seeds."""
        return [_mean(run[k].objective_value(self.goal) for run in runs) for k in range(len(runs[0]))]

    # running forward
    def forecast(self, engine: EngineView, setting: Setting, seeds: range | None = None,
                 scale: dict[KVSetting, StepScale] | None = None) -> Runs | None:
        """One run forward per forecast seed (common to every candidate, so they differ by the setting and
        not by luck); None if any of them could not run."""
        # one start for every seed: on a real backend the clock moves while they run, and a horizon cut at a
        # run's end must give each the same spans (they are averaged span by span)
        start = engine.now_s()
        runs = [self._once(engine, setting, k, start, scale) for k in (seeds or range(self.goal.forecast_seeds))]
        self.cost.forecasts += len(runs)
        done = [r for r in runs if r is not None]
        return None if len(done) < len(runs) else done

    def _once(self, engine: EngineView, setting: Setting, k: int, start: float,
              scale: dict[KVSetting, StepScale] | None = None) -> list[Tally] | None:
        """Run the swarm forward from now under `setting` in a simulator: what each span up to the horizon
        would hold (the last is the whole horizon); None where the simulator cannot run the swarm that way."""
        sim = self.simulator(engine)
        if sim is None:
            return None
        sim.scale = {**self.learned_scale(engine), **(scale or {})}
        s = replace(engine.s, batch_cap=cap_in_force(setting.batch_cap, len(engine.agents)),
                    residency=setting.residency,
                    check=False, seed=engine.s.seed + FORECAST_SEED_SALT * (k + 1), draft_model=None,
                    agents=len(engine.agents))
        shadow = shadow_of(engine, sim, s, meter=_meter(engine))
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

    def simulator(self, engine: EngineView) -> SimBackend | None:
        return self.measured.simulator(engine)

    def learned_scale(self, engine: EngineView) -> dict[KVSetting, StepScale]:
        """The step-time factors experiments measured, for the KV types whose model is still not their own
        steps' fit (always, on the sim: its model is the stated card)."""
        out = {}
        for kv, sc in self.measured_scale.items():
            own = engine.analysis.fit(kv)
            if engine.backend.source == "simulated" or own is None or own.samples < MIN_OWN_FIT_SAMPLES:
                out[kv] = sc
        return out

    def corrected_gain(self, engine: EngineView, x: Experiment, sc: StepScale) -> float | None:
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
        g = gain(sum(r[-1].score(self.goal, n) for r in new) / len(new),
                 sum(r[-1].score(self.goal, n) for r in stay) / len(stay))
        return None if g is None or g <= -1 else math.log1p(g)


def _meter(engine: EngineView) -> Meter:
    m = engine.meter
    if isinstance(m, ModeledMeter):
        return ModeledMeter(m.floor_watts, m.per_agent_watts)
    return NoMeter("forecast: no power model")


def _mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def gain(new: float, old: float) -> float | None:
    """Relative improvement of a score; scores below zero (over a cap, under a floor) count from there.
    None from a zero score: no gain can be stated against nothing."""
    if old != 0:
        return (new - old) / abs(old)
    return None

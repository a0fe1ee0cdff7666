"""The tuner's closed loop and the verdicts of its outcomes: an error that can fail, a change that
measures worse reverted and not tried again under the same conditions."""

import pytest

from swarmtune.engine.engine import Engine, EngineSettings
from swarmtune.engine.profiles import profile
from swarmtune.engine.records import AgentView, StepRecord
from swarmtune.engine.sim_backend import SimBackend
from swarmtune.engine.tune import Goal, Tally, Tuner
from swarmtune.engine.tune.watch import MIN_STEPS, Watch, verdict
from tests.conftest import SIM


def test_a_forecast_that_missed_by_26_points_disagrees():
    # the outcome of the issue: forecast +26.3%, measured -2.9%, against an error that could fail
    assert verdict(-0.029, 0.263, 0.10) == "disagrees"
    assert verdict(0.25, 0.263, 0.10) == "agrees"


def test_an_error_larger_than_the_gain_it_judges_is_inconclusive():
    # "forecast -3.0%, measured -28.8% (stated error ±127%)": such an error agrees with anything
    assert verdict(-0.288, -0.030, 1.27) == "inconclusive"
    assert verdict(None, 0.1, 0.05) is None and verdict(0.1, 0.1, None) is None


class _Model:
    def decode_seconds(self, batch, contexts, kv):
        return 0.01 * batch

    def prefill_seconds(self, tokens, pos0, kv):
        return 0.001 * tokens

    def move_seconds(self, nbytes):
        return nbytes / 1e9

    def decode_base_seconds(self, batch, kv):
        return 0.005 * batch

    def prefill_base_seconds(self, tokens, kv):
        return 0.0005 * tokens


def _decode(seconds: float, i: int) -> StepRecord:
    return StepRecord(step=i, t=float(i), kind="decode", batch=4, batch_ids=[0, 1, 2, 3], batch_cap=4, kv_type="q8_0",
                      agents=[AgentView(j, 100, "decoding", 2048, 1, 0, "", "cache") for j in range(4)],
                      weight_bytes=0, kv_bytes=0.0, seconds=seconds, tokens=4, source="measured")


@pytest.mark.parametrize("slower, worse", [(1.36, True), (1.0, False)])
def test_a_change_whose_steps_run_slower_than_forecast_is_measurably_worse(slower, worse):
    w = Watch("q8_0", 0.263, _Model())
    w.add(_decode(0.5, 0))  # a new context's first step builds its graph: left out
    for i in range(1, MIN_STEPS):
        w.add(_decode(0.04 * slower * (1 + 0.02 * (i % 3)), i))
    assert not w.worse()  # never on fewer steps than that
    for i in range(MIN_STEPS, 3 * MIN_STEPS):
        w.add(_decode(0.04 * slower * (1 + 0.02 * (i % 3)), i))
    assert w.worse() is worse
    assert w.confirmed() is (not worse)
    gain, best, least = w.realised_gain()
    assert least <= gain <= best
    assert gain == pytest.approx(1.263 / w.q - 1)
    assert w.q == pytest.approx(slower * 1.02, rel=0.02) and w.decode.q == pytest.approx(w.q)


class _Optimistic(SimBackend):
    """A forecast's simulator that thinks q8_0 steps cost half what they do: the model a tuner can have on
    a machine unlike the one its probe scaling was tried on (the issue's AVX2-only EPYC)."""

    def step_seconds(self, batch, total_context, kv=None, contexts=None):
        t = super().step_seconds(batch, total_context, kv, contexts)
        return t * 0.5 if (kv or self.kv) == "q8_0" else t


class _MisledTuner(Tuner):
    def _simulator(self, engine, correct=None):
        return _Optimistic(engine.backend.profile)


@pytest.mark.slow
def test_it_reverts_a_switch_that_measures_worse_and_does_not_try_it_again():
    p = profile(SIM)
    s = EngineSettings(agents=8, gen_tokens=256, tool_tokens=1024, kv_budget_bytes=p.kv_budget_bytes, seed=1,
                       tool_latency_s=5.0, check=True)
    # 150 s of a 120 s horizon: it switches, is reverted and switches again once the contexts moved
    goal = Goal(allowed_kv=("f16", "q8_0"), epoch_s=10.0, dwell_s=30.0, forecast_seeds=1, confirm_seeds=1,
                run_s=150.0, horizon_s=120.0)
    e = Engine(SimBackend(p), s, tuner=_MisledTuner(goal), autotune=True)
    tunes, whole = [], Tally()
    while e.now_s() < 150.0:
        r = e.step()
        whole.add(r)
        if r.kind == "tune":
            tunes.append(r.tune.to_json())
    to_q8 = [t for t in tunes if t["phase"] == "decided" and t["to"]["kv"] == "q8_0"]
    reverted = [t for t in tunes if t["phase"] == "reverted"]
    assert to_q8 and reverted, [t["why"] for t in tunes]
    assert reverted[0]["from"]["kv"] == "q8_0" and reverted[0]["q"] > 1.3  # its steps took ~2x the forecast's
    assert "measurably worse" in reverted[0]["why"]
    # not tried again while the conditions it was reverted under hold
    first = tunes.index(reverted[0])
    again = [t for t in tunes[first:] if t["phase"] == "decided" and t["to"]["kv"] == "q8_0"]
    for t in again:
        assert abs(t["mean_context"] - reverted[0]["mean_context"]) >= 0.5 * max(reverted[0]["mean_context"], 256)
    # and the run is no slower than staying at the start would have been, by more than 3%
    static = Engine(SimBackend(p), s)
    base = Tally()
    while static.now_s() < 150.0:
        base.add(static.step())
    assert whole.tokens / whole.seconds >= 0.97 * base.tokens / base.seconds


def test_a_run_of_known_length_plans_only_for_what_is_left_of_it():
    t = Tuner(Goal(epoch_s=10.0, horizon_s=240.0, run_s=80.0))
    assert t.horizon_at(0.0) == 80.0 and t.horizon_at(55.0) == 25.0 and t.horizon_at(79.0) == 10.0
    assert t.spans_for(25.0) == [10.0, 20.0, 25.0]
    assert Tuner(Goal(horizon_s=240.0)).horizon_at(1000.0) == 240.0


def test_a_short_run_tries_kv_types_on_the_swarm_rather_than_probing_them():
    # a probe costs 3-8 s here: 4-8% of a 100 s run, under 1% of a long one
    assert not Tuner(Goal(run_s=100.0)).probes_pay()
    assert Tuner(Goal(run_s=3600.0)).probes_pay() and Tuner(Goal()).probes_pay()


def test_a_kv_types_measured_difference_grows_with_the_contexts_as_attention_does():
    # a type measured 1.2x its model where half the modeled step was attention: its attention is 1.4x, so
    # at a context where attention is most of the step it is nearly 1.4x slower, not 1.2x
    from swarmtune.engine.step_model import Fit
    from swarmtune.engine.tune.simulator import attention_factor

    assert attention_factor(1.2, 0.5) == pytest.approx(1.4)
    assert attention_factor(1.2, 0.9) is None  # attention too small a share to tell: the whole step scales
    assert attention_factor(9.0, 0.5) == 4.0  # clamped: past that it is noise
    fit = Fit(knots=((1, 0.01), (8, 0.02)), per_kv_token_seconds=1e-6, rms_relative_error=0.0, samples=40)
    short, long = fit.step_seconds(8, 8 * 1250), fit.step_seconds(8, 8 * 100_000)
    f = attention_factor(1.2, fit.batch_seconds(8) / short)
    assert f is not None
    corrected = fit.attention_scaled(f)
    assert corrected.step_seconds(8, 8 * 1250) == pytest.approx(1.2 * short)
    assert corrected.step_seconds(8, 8 * 100_000) / long > 1.35


def test_an_outcome_is_not_judged_on_turns_of_another_shape(monkeypatch):
    """The objective against the forecast of staying says nothing once the turns changed shape: that forecast
    was of other turns (a swarm that went from reading to writing measured -72% "against staying" here)."""
    from types import SimpleNamespace

    p = profile(SIM)
    s = EngineSettings(agents=8, gen_tokens=256, tool_tokens=1024, kv_budget_bytes=p.kv_budget_bytes, seed=1,
                       tool_latency_s=5.0, ctx_per_agent=p.context_per_agent)
    goal = Goal(allowed_kv=("f16", "q8_0"), epoch_s=10.0, dwell_s=30.0, horizon_s=120.0, forecast_seeds=1,
                confirm_seeds=1)
    e = Engine(SimBackend(p), s, tuner=Tuner(goal), autotune=True)
    while e.tuner._pending is None and e.now_s() < 100:
        e.step()
    assert e.tuner._pending is not None
    worse = SimpleNamespace(measured_gain=-0.72, stated_error=0.24, span_s=20.0)  # past its error: a revert
    monkeypatch.setattr(e.tuner, "_measured", lambda *args, **kwargs: worse)
    e.set_workload(gen_tokens=192, tool_tokens=16)
    assert e.tuner._check_outcome(e) == []
    e.set_workload(gen_tokens=256, tool_tokens=1024)  # the turns the forecast ran on: judged, and reverted
    out = e.tuner._check_outcome(e)
    assert out and "measurably worse than staying" in out[-1].why

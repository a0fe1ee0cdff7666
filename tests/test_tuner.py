"""The tuner: it tries the setting its forecasts propose on the swarm itself and keeps it only on what that
measured, keeps to the KV types it is allowed, holds still when nothing changes, counts what it spends,
says every decision in a record, and its forecasts run on a real backend from what this run measured."""

import dataclasses
import json
import math
from types import SimpleNamespace

import pytest

from swarmtune.engine.backends.sim_backend import SimBackend
from swarmtune.engine.control import Control
from swarmtune.engine.engine import Engine, EngineSettings
from swarmtune.engine.errors import UserError
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.measure.kv_probe import KvProbe
from swarmtune.engine.model.profiles import misstated, profile
from swarmtune.engine.tune.experiment import MIN_PAIRS
from swarmtune.engine.tune.forecast import Forecaster
from swarmtune.engine.tune.goal import Goal, Setting, parse_objective
from swarmtune.engine.tune.propose import Proposer
from swarmtune.engine.tune.tally import SpanTally
from swarmtune.engine.tune.tuner import Tuner
from tests.conftest import SIM, run_cli

KV = KVSetting.parse  # a KV setting as a flag spells it

# short horizons keep the tests quick; the bench uses the defaults
FAST = dict(epoch_s=10.0, horizon_s=120.0, forecast_seeds=1)


def _engine(goal: Goal, agents: int = 8, latency_s: float = 5.0, kv: str = "f16", ctx: int | None = None,
            budget: bool = True) -> Engine:
    p = profile(SIM)
    s = EngineSettings(agents=agents, kv=KV(kv), ctx_per_agent=ctx or p.context_per_agent, gen_tokens=256,
                       tool_tokens=1024, kv_budget_bytes=p.kv_budget_bytes if budget else None,
                       tool_latency_s=latency_s, seed=1, check=True)
    return Engine(SimBackend(p), s, tuner=Tuner(goal), autotune=True)


def _run(e: Engine, seconds: float) -> list:
    out = []
    while e.now_s() < seconds:
        out.append(e.step())
    return out


@pytest.fixture(scope="module")
def swarm_180s():
    """One seeded 180 s run with f16 and q8_0 allowed (the sim is deterministic), read by several tests:
    (the engine after it, its records, and after each record whether every forecast of staying still being
    checked was made for the setting then in force)."""
    e = _engine(Goal(allowed_kv=(KV("f16"), KV("q8_0")), **FAST))
    recs, checks_match = [], []
    while e.now_s() < 180:
        recs.append(e.step())
        now = Tuner.setting(e)
        checks_match.append(all(s == now for s in e.tuner.checks.open_settings))
    return e, recs, checks_match


def _events(recs, phase: str) -> list[dict]:
    return [r.tune.to_json() | {"t": r.t} for r in recs if r.kind == "tune" and r.tune.phase == phase]


@pytest.mark.slow
@pytest.mark.xdist_group("swarm_180s")  # one worker makes the run its tests read
def test_allowed_a_smaller_kv_it_tries_it_on_the_swarm_and_keeps_it_on_what_it_measured(swarm_180s):
    e, recs, _ = swarm_180s
    trials, done = _events(recs, "trial"), _events(recs, "experiment")
    assert trials and trials[0]["to"]["kv"] == "q8_0" and trials[0]["forecast_gain_source"] == "modeled"
    kept = [d for d in done if d["result"] == "kept"]
    assert kept and kept[0]["to"]["kv"] == "q8_0" and e.s.kv == KV("q8_0"), [d["why"] for d in done]
    k = kept[0]
    # kept on measurement: its pairs, the step times they measured, the gain forecast again on them, at 95%
    assert k["pairs"] >= MIN_PAIRS and k["confidence"] == 0.95 and k["decode_factor"] is not None
    assert k["corrected_low"] is not None and k["corrected_low"] > 0 and "(measured)" in k["why"]
    assert k["switches"] >= 2 and k["switch_cells"] > 0 and k["switch_s"] > 0
    # the decision follows its experiment, at once, and says what it rests on
    [d] = [d for d in _events(recs, "decided") if d["t"] == k["t"]]
    assert d["to"] == k["to"] and d["predicted_gain_source"].startswith("modeled on step times measured")
    # the sim's model is the card itself: the step times agree with it exactly, and so every verdict agrees
    assert all(x["verdict"] == "agrees" for x in done if x["pairs"] >= MIN_PAIRS), [x["why"] for x in done]


@pytest.mark.slow
def test_it_never_uses_a_kv_type_it_was_not_allowed():
    e = _engine(Goal(**FAST))  # allowed_kv () means the run's own only
    recs = _run(e, 100)
    assert all(r.kv_type == "f16" for r in recs)
    assert all(r.tune.to_json()["to"]["kv"] == "f16" for r in recs if r.kind == "tune" and "to" in r.tune.to_json())


@pytest.mark.slow
def test_it_holds_still_when_nothing_changes():
    """No budget pressure and no tool waits: every setting's forecast is steady. It keeps at most one change
    and never goes back. Without waits the swarm decodes all the time: a 60 s horizon keeps forecasts cheap."""
    e = _engine(Goal(allowed_kv=(KV("f16"), KV("q8_0")), **{**FAST, "horizon_s": 60.0}), agents=4, latency_s=0.0,
                ctx=4096, budget=False)
    recs = _run(e, 100)
    decided = _events(recs, "decided")
    assert len(decided) <= 1, [d["why"] for d in decided]


@pytest.mark.slow
@pytest.mark.xdist_group("swarm_180s")  # one worker makes the run its tests read
def test_it_never_oscillates(swarm_180s):
    _, recs, _ = swarm_180s
    # no A -> B -> A -> B: a setting it left comes back at most once
    seen = [json.dumps(d["to"], sort_keys=True) for d in _events(recs, "decided")]
    assert all(seen.count(s) <= 2 for s in seen), seen


def test_turned_off_it_decides_nothing_and_an_engine_without_one_refuses():
    e = _engine(Goal(allowed_kv=(KV("f16"), KV("q8_0")), **FAST))
    assert e.state().autotune is True
    e.request(Control(autotune=False))
    recs = _run(e, 150)
    assert not any(r.kind == "tune" for r in recs)
    assert e.state().autotune is False
    p = profile(SIM)
    plain = Engine(SimBackend(p), EngineSettings())
    assert plain.state().autotune is None
    with pytest.raises(UserError, match="no tuner"):
        plain.request(Control(autotune=True))


@pytest.mark.parametrize("bad", ["speed", "floor", "floor:-1", "floor:x", "tokens_per_s:3"])
def test_a_bad_objective_is_one_line(bad):
    with pytest.raises(UserError):
        parse_objective(bad)


def test_floor_objective_scores_below_the_floor_as_infeasible():
    from swarmtune.engine.tune.tally import Tally

    t = Tally(tokens=100, seconds=10.0, per_agent={0: 90, 1: 10})
    assert t.score(Goal(objective="tokens_per_s"), 2) == pytest.approx(10.0)
    assert t.score(Goal(objective="floor", floor_tokens_per_s=0.5), 2) == pytest.approx(10.0)
    assert t.score(Goal(objective="floor", floor_tokens_per_s=2.0), 2) < 0
    assert Tally().score(Goal(), 2) == 0.0
    assert math.isfinite(t.score(Goal(objective="joules_per_token"), 2))


def test_tune_command_prints_the_setting_as_engine_flags():
    r = run_cli("tune", "--sim", SIM, "--tune-kv", "f16,q8_0", "--tool-latency", "5", "--gen-tokens", "256",
                "--tool-tokens", "1024", "--duration", "60", "--json", "-")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out["setting"]) == {"batch_cap", "kv", "residency"}
    engines = {x["engine"]: x for x in out["engines"]}
    ll = engines["llama-server"]["flags"]
    assert ll[ll.index("-np") + 1] == str(out["setting"]["batch_cap"])
    assert ll[ll.index("-ctk") + 1] == out["setting"]["kv"]
    v = engines["vLLM"]["flags"]
    assert v[v.index("--max-num-seqs") + 1] == str(out["setting"]["batch_cap"])
    assert "--gpu-memory-utilization" in v  # the sim card's memory is known
    assert "--parallel" in engines["ZINC"]["flags"]
    assert out["tokens_per_s"]["source"] == "simulated"
    assert "best setting" in r.stderr
    # and what the tuner spent to find it
    assert {"think_s", "switch_s", "switch_cells", "experiments", "tokens_lost"} <= set(out["tuner_cost"])
    assert "tuner spent" in r.stderr


def test_tune_flags_refuse_bad_input_in_one_line():
    r = run_cli("tune", "--sim", SIM, "--autotune", "speed", "--duration", "5")
    assert r.returncode == 2 and "unknown objective" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("record", "--sim", SIM, "--tune-kv", "q8_0", "-o", "/tmp/x.jsonl", "--steps", "3")
    assert r.returncode == 2 and "leaves out --kv f16" in r.stderr


@pytest.mark.model
def test_on_a_real_backend_it_forecasts_from_what_this_run_measured(llama_backend):
    """The calibrated simulator: the step-time fit and the prefill rate of this very run."""
    e = Engine(llama_backend, EngineSettings(agents=4, ctx_per_agent=640, gen_tokens=16, tool_tokens=64, seed=2,
                                             tool_latency_s=0.2, tool_latency_sigma=0.5),
               # every look is taken (no thinking budget): on a slow machine the budget would skip the looks
               # whose forecasts of staying are checked below
               tuner=Tuner(Goal(epoch_s=1.0, horizon_s=4.0, forecast_seeds=1, think_share=1.0)),
               autotune=True)
    while e.now_s() < 8.0:
        e.step()
    cur = Setting(e.s.batch_cap, e.s.kv, e.s.residency)
    [spans] = e.tuner.forecast(e, cur)
    whole = spans[-1]
    assert len(spans) == len(e.tuner.spans) == 4
    # a span holds the steps up to its end: the step that crosses it (here up to a prefill chunk) is not in it
    assert whole.tokens > 0 and 3.0 <= whole.seconds <= 4.0 + 1e-6
    assert all(a.seconds <= b.seconds for a, b in zip(spans, spans[1:], strict=False))
    # and the forecast of staying, checked against what came, gives the tuner a stated error
    assert e.tuner.checks.errors, "no forecast was checked against the run"


class _TimedSim(SimBackend):
    """The simulated card with its steps taken as a real backend's: the tuner's model of it is fit on the run's
    own steps (the paths of a real backend), and the steps are quick."""

    source = "measured"


def test_a_first_look_on_a_young_fit_is_taken_again_once_the_fit_has_its_steps(monkeypatch):
    """On a real backend the first look comes on a fit of a few steps; one that changed nothing is taken again
    once the run's own fit has MIN_OWN_FIT_SAMPLES steps, not an epoch later (an epoch is a sixth of the
    bench's run, and a KV switch is cheapest while the caches are short)."""
    from swarmtune.engine.tune.measured import MIN_OWN_FIT_SAMPLES

    looks: list[tuple[float, int, int]] = []  # (when, the fit's steps then, the events it gave)
    real_look = Tuner._look

    def counted(self, engine, now, kv_only=False):
        fit = engine.analysis.fit(engine.s.kv)
        out = real_look(self, engine, now, kv_only)
        looks.append((now, fit.samples if fit is not None else 0, len(out)))
        return out

    monkeypatch.setattr(Tuner, "_look", counted)
    p = profile(SIM)
    epoch_s = 3.0

    def run(backend: SimBackend) -> None:
        e = Engine(backend, EngineSettings(agents=8, ctx_per_agent=p.context_per_agent, gen_tokens=64,
                                           tool_tokens=128, seed=1),
                   tuner=Tuner(Goal(epoch_s=epoch_s, horizon_s=epoch_s, forecast_seeds=1, think_share=1.0)),
                   autotune=True)
        while (fit := e.analysis.fit(e.s.kv)) is None or fit.samples < MIN_OWN_FIT_SAMPLES + 16:
            e.step()

    run(_TimedSim(p))
    assert len(looks) >= 2 and [n for *_, n in looks[:2]] == [0, 0], looks  # neither changed anything
    # the second came as the fit reached its steps (its steps come by the millisecond here), not an epoch on
    assert looks[0][1] < MIN_OWN_FIT_SAMPLES <= looks[1][1] < MIN_OWN_FIT_SAMPLES + 8, looks
    assert looks[1][0] - looks[0][0] < epoch_s, looks
    # on the simulated card, whose model is the card itself, every look is an epoch after the last
    looks.clear()
    run(SimBackend(p))
    assert looks and all(b[0] - a[0] >= epoch_s for a, b in zip(looks, looks[1:], strict=False)), looks


def test_a_kv_type_whose_budget_cannot_hold_one_agent_is_no_candidate():
    p = profile(SIM)
    s = EngineSettings(agents=1, ctx_per_agent=1600, gen_tokens=256, tool_tokens=1024, kv_budget_bytes=300e6,
                       tool_latency_s=5.0, seed=1)
    e = Engine(SimBackend(p), s, tuner=Tuner(Goal(allowed_kv=(KV("f16"), KV("f32")), **FAST)), autotune=True)
    e.start()
    cands = e.tuner.candidates(e, Setting(1, KV("f16"), "keep"))
    assert cands and all(c.kv == KV("f16") for c in cands)
    _run(e, 60)  # and the run goes on: no forecast or decision raises out of the step


def test_a_residency_experiments_blocks_last_at_least_a_tool_wait():
    """Residency acts when an agent leaves for a tool and when it comes back: a block shorter than a wait
    would put the swap-out in one side's block and the swap-in in the other's."""
    e = _engine(Goal(**FAST), latency_s=5.0)
    e.start()
    cur = Setting(8, KV("f16"), "keep")
    block = e.tuner.proposer.block_s
    assert block(e, cur, dataclasses.replace(cur, residency="swap")) >= 5.0
    assert block(e, cur, dataclasses.replace(cur, batch_cap=4)) == Goal().block_s  # FAST leaves it as is
    quick = _engine(Goal(**FAST), latency_s=0.2)  # waits shorter than a block: the block as for any move
    quick.start()
    assert quick.tuner.proposer.block_s(quick, cur, dataclasses.replace(cur, residency="swap")) == Goal().block_s


def _step(t: float, tokens: int = 4, seconds: float = 1.0):
    return SimpleNamespace(t=t, kind="decode", seconds=seconds, residency_seconds=0.0, lost_tokens=0, tokens=tokens,
                           batch_ids=[0], joules=None, watts=None)


def test_a_span_closes_at_the_first_step_past_it_and_holds_only_what_came_before():
    st = SpanTally(100.0, [10.0, 20.0, 30.0])
    for t in range(101, 126):
        st.add(_step(float(t)))
    assert [x.tokens for x in st.closed] == [40, 80]  # steps at 101..110 and 101..120; 130 not yet passed
    assert len(st.finish()) == 3 and st.finish()[-1].tokens == 100  # a forecast's end fills the rest


def test_the_stated_error_is_of_the_same_span_or_a_shorter_one_never_a_longer():
    tuner = Tuner(Goal(epoch_s=10.0, horizon_s=30.0))
    assert tuner.spans == [10.0, 20.0, 30.0]
    assert tuner.stated_error(2) is None
    tuner.checks.errors = {0: [0.2, -0.2, 0.2], 1: [0.1, -0.1, 0.1], 2: [0.05, 0.05]}
    assert tuner.stated_error(1) == pytest.approx(0.2)  # twice the rms over 20 s
    assert tuner.stated_error(2) == pytest.approx(0.2)  # 30 s has only 2 checks: the 20 s one, wider
    assert tuner.stated_error(0) == pytest.approx(0.4)


def test_a_run_that_ends_mid_experiment_still_says_what_it_measured():
    e = _engine(Goal(allowed_kv=(KV("f16"), KV("q8_0")), **FAST))
    recs, end = [], 300.0
    while e.now_s() < end:
        recs.append(e.step())
        if recs[-1].kind == "tune" and recs[-1].tune.phase == "trial":
            end = min(end, e.now_s() + 6.0)  # the run ends well before the experiment could
    assert _events(recs, "trial") and not _events(recs, "experiment")
    last = e.tuner.outcome_now(e)
    assert last is not None and last.phase == "experiment" and last.result == "ended" and last.verdict is None
    assert e.tuner.outcome_now(e) is None  # said once


@pytest.mark.slow
@pytest.mark.xdist_group("swarm_180s")  # one worker makes the run its tests read
def test_a_forecast_of_staying_is_never_checked_against_a_setting_it_did_not_forecast(swarm_180s):
    _, recs, checks_match = swarm_180s
    assert all(checks_match)  # after every step of the run
    assert _events(recs, "trial")


@pytest.mark.model
def test_on_a_real_backend_it_times_the_kv_types_it_may_use_before_the_first_step(llama_backend):
    """A KV type the run has not used is timed in a side cache before the swarm's first step: its forecasts
    come from what this machine measured, not from another type's speed, and the first look (when a KV
    switch costs nothing) comes before anything was prefilled."""
    e = Engine(llama_backend, EngineSettings(agents=4, ctx_per_agent=640, gen_tokens=16, tool_tokens=64, seed=2,
                                             tool_latency_s=0.2, tool_latency_sigma=0.5),
               tuner=Tuner(Goal(allowed_kv=(KV("f16"), KV("q8_0")), epoch_s=1.0, horizon_s=4.0,
                                forecast_seeds=1, think_share=1.0)),
               autotune=True)
    first = e.step()
    probed = first.tune.to_json() if first.tune is not None else {}
    assert first.kind == "tune" and probed["phase"] == "probed", first.note
    assert (probed["kv"], probed["base_kv"], probed["batch"]) == ("q8_0", "f16", 4)
    assert probed["source"] == "measured in a side cache" and probed["probe_seconds"] > 0
    # both types have a step-time fit and a prefill fit before any step of the swarm ran
    sim = e.tuner.forecaster.simulator(e)
    assert sim is not None and {KV("f16"), KV("q8_0")} <= set(sim.fits) and set(sim.prefills) == {KV("f16"), KV("q8_0")}
    assert e.tuner.measured.step_time_source(e, KV("q8_0")).startswith("KV f16's fit scaled by a side-cache probe")
    # the first look came at once: staying is being checked, and an experiment may have begun
    assert e.tuner._looked and (e.tuner.checks.open_settings or e.tuner.trials.exp is not None)
    steps = [e.step() for _ in range(40)]
    assert all(r.kind != "tune" or r.tune.to_json()["phase"] != "probed" for r in steps)  # once per type and run
    kinds = [r.kind for r in steps]
    assert "prefill" in kinds and "decode" in kinds


@pytest.mark.model
def test_a_short_run_times_a_kv_type_on_an_agents_history_converted_then_looks(llama_backend):
    """A run too short for prefilled probes: nothing is timed before the first step; once an agent holds a
    history, the KV type is timed on it, converted, once; what that took counts in the exploration budget,
    and a look follows at once on the scaled fit."""
    e = Engine(llama_backend, EngineSettings(agents=4, ctx_per_agent=640, gen_tokens=16, tool_tokens=128, seed=2,
                                             tool_latency_s=0.1, tool_latency_sigma=0.5),
               tuner=Tuner(Goal(allowed_kv=(KV("f16"), KV("q8_0")), epoch_s=1.0, horizon_s=4.0, run_s=120.0,
                                forecast_seeds=1, think_share=1.0, explore_share=0.2)),
               autotune=True)

    def probed(recs: list) -> list[dict]:
        return [r.tune.to_json() for r in recs if r.kind == "tune" and r.tune.to_json()["phase"] == "probed"]

    recs = [e.step() for _ in range(12)]
    assert not probed(recs) and not e.tuner._convert_tried  # nothing to time it on yet
    while not e.tuner._convert_tried and len(recs) < 400:
        looks = e.tuner.cost.looks
        recs.append(e.step())
    assert e.tuner.cost.probe_s > 0
    assert e.tuner.cost.looks == looks + 1  # the look on what it measured, with the step that probed
    while not probed(recs) and len(recs) < 400:  # its record follows
        recs.append(e.step())
    assert len(probed(recs)) == 1, [r.note for r in recs if r.kind == "tune"]
    p = probed(recs)[0]
    assert (p["kv"], p["base_kv"], p["history"]) == ("q8_0", "f16", "converted") and "converted" in p["why"]
    assert p["contexts"][1] >= 128 and p["probe_seconds"] > 0 and not p["prefill"]
    assert e.tuner.trials.explored_s >= e.tuner.cost.probe_s > 0
    assert e.tuner.measured.step_time_source(e, KV("q8_0")).startswith("KV f16's fit scaled by a side-cache probe")
    recs += [e.step() for _ in range(20)]
    assert len(probed(recs)) == 1  # once a run
    # and a look came at once on what it measured: staying is being checked, or an experiment began
    assert e.tuner.checks.open_settings or e.tuner.trials.exp is not None or _events(recs, "trial")


def _misstated(true: dict, seconds: float, tuned: bool, seed: int = 1):
    """The simulated RX 9070 XT as it is (`true`) under a tuner that forecasts with its profile as listed."""
    p = profile(SIM)
    t = misstated(p, true)
    s = EngineSettings(agents=8, kv=KV("f16"), ctx_per_agent=p.context_per_agent, gen_tokens=256, tool_tokens=1024,
                       kv_budget_bytes=p.kv_budget_bytes, tool_latency_s=5.0, seed=seed, check=False)
    e = Engine(SimBackend(t, stated=p), s, tuner=Tuner(Goal(allowed_kv=(KV("f16"), KV("q8_0")), run_s=seconds, **{
        k: v for k, v in FAST.items() if k != "horizon_s"})) if tuned else None, autotune=tuned)
    recs = _run(e, seconds)
    return sum(r.tokens for r in recs if r.kind == "decode") / e.now_s(), recs


@pytest.mark.slow
@pytest.mark.parametrize("true", [{"kv_cost": {"q8_0": 2.5}}, {"compute": 1.4}, {"bandwidth": 0.6}],
                         ids=["q8_0-kv-2.5x", "compute-1.4x", "bandwidth-0.6x"])
def test_a_card_its_model_misstates_leaves_the_tuner_at_or_above_its_start(true):
    """The card is not what the tuner's model says (a KV type's cost 2.5x its bytes, so that the model's sign
    is wrong; compute or bandwidth 40% off): what it keeps, it kept on what the swarm measured, and the run
    ends at least 0.97 of staying at its start (issue 54's bar). One seed is one trajectory of which histories
    the budget drops, and an experiment shifts it: on the 2.5x card, where since 072f029 q8_0 forecast again
    on its measured steps is within 1% of f16 and is not kept, five seeds ran 0.970-1.011 of their start."""
    start, _ = _misstated(true, 240.0, tuned=False)
    tuned, recs = _misstated(true, 240.0, tuned=True)
    assert tuned >= 0.97 * start, [r.note for r in recs if r.kind == "tune"]


@pytest.mark.slow
def test_an_experiment_within_the_forecasts_error_on_a_flat_workload_is_never_kept_on_too_few_pairs():
    """A flat swarm (no tool waits, no budget): every proposal is within the forecast's error, an exploration.
    Whatever it keeps, it kept on at least MIN_PAIRS pairs whose unfavourable bound cleared the bar."""
    e = _engine(Goal(allowed_kv=(KV("f16"), KV("q8_0")), explore_share=0.5,
                     **{**FAST, "horizon_s": 60.0, "prior_error": 0.5}), agents=4, latency_s=0.0, ctx=4096,
                budget=False)
    recs = _run(e, 120)
    trials, done = _events(recs, "trial"), _events(recs, "experiment")
    # the first ones, at least, are explorations (once the error is measured here it is small, and a
    # forecast past it proposes as any other)
    assert trials and trials[0]["exploratory"], [t["why"] for t in trials]
    for d in done:
        if d["result"] == "kept":
            assert d["pairs"] >= MIN_PAIRS and d["corrected_low"] is not None
            assert math.log1p(d["corrected_low"]) > next(t["bar"] for t in trials if t["to"] == d["to"])
    # an exploration begins only where the least it takes fits the budget left
    for t in trials:
        if t["exploratory"]:
            assert t["explored_s"] + t["explore_least_s"] <= t["explore_budget_s"] + 1e-6, t["why"]
            assert "from the exploration budget" in t["why"]


@pytest.mark.slow
def test_a_tuner_whose_thinking_is_dear_thinks_less_and_says_what_it_spent():
    def run(think_s: float) -> Tuner:
        e = _engine(Goal(allowed_kv=(KV("f16"), KV("q8_0")), sim_think_s=think_s, **FAST))
        _run(e, 120)
        assert "tuner spent" in e.tuner.cost.line(e.now_s())
        return e.tuner

    cheap, dear = run(0.0), run(0.5)  # 0.5 s of the swarm's clock per forecast
    assert dear.cost.forecasts < cheap.cost.forecasts and dear.cost.looks_skipped > dear.cost.looks
    assert cheap.cost.looks_skipped == 0
    # it thought no more than its share of the run (and the epoch's credit)
    assert dear.cost.think_s <= dear.goal.think_share * (120.0 + dear.goal.epoch_s) + 0.5 * 8


def test_a_look_that_finds_nothing_within_reach_makes_the_next_wait_a_second_epoch(monkeypatch):
    """Every move forecast to make half the tokens of staying, far past any error: thinking that could gain
    nothing, waived one epoch in two; a change of the turns' shape looks at once."""
    import swarmtune.engine.tune.tuner as tuner_module

    real_forecast = Forecaster.forecast

    def moves_lose(self, engine, setting, seeds=None, scale=None):
        runs = real_forecast(self, engine, setting, seeds, scale)
        if runs is not None and setting != Tuner.setting(engine):
            for run in runs:
                run[-1].tokens //= 2
        return runs

    monkeypatch.setattr(Forecaster, "forecast", moves_lose)

    def run(wait_max: int, shape_at_s: float | None = None) -> Tuner:
        monkeypatch.setattr(tuner_module, "WAIT_EPOCHS_MAX", wait_max)
        e = _engine(Goal(allowed_kv=(KV("f16"), KV("q8_0")), **{**FAST, "horizon_s": 60.0}), budget=False)
        while e.now_s() < 120:
            if shape_at_s is not None and e.now_s() >= shape_at_s:
                e.s = dataclasses.replace(e.s, gen_tokens=e.s.gen_tokens // 2)  # the workload's turns change
                shape_at_s = None
            e.step()
        assert e.tuner.cost.experiments == 0  # nothing was worth one
        return e.tuner

    every, paced = run(1), run(2)
    assert every.cost.looks_waived == 0 and every.cost.looks >= 10
    assert paced.cost.looks_waived >= 4 and paced.cost.looks <= every.cost.looks - 4
    assert f"{paced.cost.looks_waived} waived" in paced.cost.line()
    # the turns' shape changed 5 s into a wait: the look came then, not 15 s later
    shaped = run(2, shape_at_s=45.0)
    assert shaped.cost.looks > paced.cost.looks


def _forecast_q8_ahead(monkeypatch, factor: float) -> None:
    """Every forecast at q8_0 generates `factor` times the tokens it would: a gain past any margin and error."""
    real_forecast = Forecaster.forecast

    def better_q8(self, engine, setting, seeds=None, scale=None):
        runs = real_forecast(self, engine, setting, seeds, scale)
        if runs is not None and setting.kv == KV("q8_0"):
            for run in runs:
                run[-1].tokens = int(run[-1].tokens * factor)
        return runs

    monkeypatch.setattr(Forecaster, "forecast", better_q8)


def test_a_kv_type_never_timed_here_is_tried_only_as_an_exploration(monkeypatch):
    """On a real backend (here the simulated card with its steps taken as measured) a KV type that has not
    run, been probed or been measured in an experiment is forecast on another type's step times: its
    forecast gain, however large, is within an error nothing measured, so a trial of it is an exploration
    (from that budget), and the trial says why. On the simulated card, whose model states every type, it
    is timed."""
    p = profile(SIM)
    s = EngineSettings(agents=4, ctx_per_agent=p.context_per_agent, gen_tokens=64, tool_tokens=128, seed=1,
                       check=False)
    goal = Goal(allowed_kv=(KV("f16"), KV("q8_0")), run_s=300.0, explore_share=0.0, **FAST)  # too short to probe
    e = Engine(_TimedSim(p), s, tuner=Tuner(goal), autotune=True)
    for _ in range(40):
        e.step()
    assert e.tuner.proposer.timed(e, KV("f16")) and not e.tuner.proposer.timed(e, KV("q8_0"))
    sim = Engine(SimBackend(p), s, tuner=Tuner(Goal(allowed_kv=(KV("f16"), KV("q8_0")))), autotune=True)
    assert sim.tuner.proposer.timed(sim, KV("q8_0"))
    # a forecast that q8_0 gains 40% (past any margin and error) still proposes it only as an exploration
    cur = Setting(4, KV("f16"), "keep")
    base = e.tuner.forecast(e, cur)
    assert base is not None
    _forecast_q8_ahead(monkeypatch, 1.4)
    monkeypatch.setattr(Proposer, "candidates", lambda self, engine, c: [Setting(4, KV("q8_0"), "keep")])
    assert e.tuner.propose(e, cur, base, kv_only=True) is None  # no exploration budget: not tried at all
    e.tuner.goal = dataclasses.replace(goal, explore_share=0.5)
    if e.tuner._probe_pending(e, cur):  # a probe on the swarm's history is still to come: it goes first
        assert e.tuner.propose(e, cur, base, kv_only=True) is None
        e.tuner._convert_tried = True  # as once it was weighed (and refused: explore_share was 0)
    trial = e.tuner.propose(e, cur, base, kv_only=True)
    assert trial is not None and trial.to.kv == KV("q8_0") and trial.exploratory, trial
    assert "never timed here" in trial.why


def test_a_kv_type_timed_only_by_a_noisy_probe_is_tried_only_as_an_exploration(monkeypatch):
    """A KV type whose step times stand on its side-cache probe is forecast on ratios each probe point's steps
    spread around (each point a median of 3): where that spread could move its step time more than the
    stated error, its gain is judged against the spread, and a gain within it is an exploration. The same
    probe with tight points proposes it as an experiment past its error."""
    p = profile(SIM)
    s = EngineSettings(agents=4, ctx_per_agent=p.context_per_agent, gen_tokens=64, tool_tokens=128, seed=1,
                       check=False)
    goal = Goal(allowed_kv=(KV("f16"), KV("q8_0")), run_s=300.0, explore_share=0.0, **FAST)
    e = Engine(_TimedSim(p), s, tuner=Tuner(goal), autotune=True)
    for _ in range(40):
        e.step()
    e.tuner._convert_tried = True  # no probe of its own: the one below stands for q8_0
    cur, q8 = Setting(4, KV("f16"), "keep"), Setting(4, KV("q8_0"), "keep")
    base = e.tuner.forecast(e, cur)
    assert base is not None
    _forecast_q8_ahead(monkeypatch, 1.4)
    monkeypatch.setattr(Proposer, "candidates", lambda self, engine, c: [q8])
    line = [(4, 68.0, 0.020), (4, 516.0, 0.030)]  # both types alike: the probe changes no forecast itself

    def probed(spread_s: float) -> KvProbe:
        return KvProbe(KV("q8_0"), KV("f16"), 4, (64, 512), {KV("f16"): line, KV("q8_0"): line}, {}, 1.0,
                       spread={KV("f16"): [spread_s] * 2, KV("q8_0"): [spread_s] * 2})

    e.tuner.measured.probes[KV("q8_0")] = probed(0.0001)
    assert e.tuner.proposer.timed(e, KV("q8_0"))
    trial = e.tuner.propose(e, cur, base, kv_only=True)
    assert trial is not None and trial.to == q8 and not trial.exploratory, trial.why
    e.tuner.trials.exp = None
    e.tuner.measured.probes[KV("q8_0")] = probed(0.008)  # each point 8 ms either way of its median
    err = e.tuner.measured.probe_error(e, KV("q8_0"))
    assert err is not None and err[0] > 0.5
    assert e.tuner.propose(e, cur, base, kv_only=True) is None  # within that error, and no exploration budget
    e.tuner.goal = dataclasses.replace(goal, explore_share=0.5)
    trial = e.tuner.propose(e, cur, base, kv_only=True)
    assert trial is not None and trial.exploratory and "side-cache probe's spread" in trial.why, trial.why
    assert trial.forecast_error == pytest.approx(err[0], abs=1e-4) and "probe" in trial.forecast_error_source


def test_a_kv_block_is_as_long_as_the_prefill_its_switches_cause_while_the_budget_holds_agents_out():
    """While the KV budget holds agents out, a switch to the type that holds more admits them (their histories
    prefilled again) and the way back evicts them: that prefill is every switch's cost, so a block lasts
    BLOCK_PER_SWITCH times it too. Without anyone waiting, the rebuild alone sets it."""
    from swarmtune.engine.agents.agent import AgentState
    from swarmtune.engine.tune.propose import BLOCK_PER_SWITCH

    p = profile(SIM)
    s = EngineSettings(agents=8, ctx_per_agent=p.context_per_agent, gen_tokens=256, tool_tokens=1024, seed=1,
                       kv_budget_bytes=p.kv_budget_bytes / 4, check=False)
    e = Engine(SimBackend(p), s, tuner=Tuner(Goal(allowed_kv=(KV("f16"), KV("q8_0")), **FAST)), autotune=True)
    cur, q8 = Setting(8, KV("f16"), "keep"), Setting(8, KV("q8_0"), "keep")
    assert e.tuner.forecaster.measured.readmit_s(e, cur.kv, q8.kv) == 0.0  # nobody waits yet
    quiet = e.tuner.proposer.block_s(e, cur, q8)
    for _ in range(3000):
        e.step()
        if any(a.state is AgentState.PREEMPTED and a.pending for a in e.agents):
            break
    waiting = sum(len(a.pending) for a in e.agents if a.state is AgentState.PREEMPTED)
    assert waiting > 0, "the budget never held an agent out"
    swing = abs(e.budget_tokens(KV("q8_0")) - e.budget_tokens(KV("f16")))
    readmit = e.tuner.forecaster.measured.readmit_s(e, cur.kv, q8.kv)
    assert readmit == pytest.approx(min(waiting, swing) / p.prefill_tokens_per_s)
    assert e.tuner.proposer.block_s(e, cur, q8) >= max(quiet, BLOCK_PER_SWITCH * readmit) - 1e-9
    assert e.tuner.proposer.block_s(e, cur, Setting(4, KV("f16"), "keep")) == e.tuner.goal.block_s  # a cap: none


def test_every_seed_of_a_forecast_has_the_same_spans_while_the_clock_moves(monkeypatch):
    """On a real backend the clock moves while a forecast's seeds run one after another: near a run's end
    each would cut its horizon at a different span count, and averaging them span by span failed (an
    IndexError in the bench's changing workload). Every seed starts from one reading of the clock."""
    e = _engine(Goal(allowed_kv=(KV("f16"),), run_s=105.0, epoch_s=10.0, horizon_s=240.0, forecast_seeds=2))
    for _ in range(30):
        e.step()
    clock = iter([84.99 + 0.2 * i for i in range(1000)])
    monkeypatch.setattr(e, "now_s", lambda: next(clock))
    runs = e.tuner.forecast(e, Tuner.setting(e))
    assert runs is not None and len(runs) == 2 and len(runs[0]) == len(runs[1]) == 3
    assert e.tuner.forecaster.objectives(runs)  # averaged span by span

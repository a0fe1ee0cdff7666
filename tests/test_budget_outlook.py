"""The tuner's foresight of the KV budget (issue 54): it says when the budget will bind at the setting in force
before the churn starts, weighs each way out against what staying will re-prefill, and under a quality
budget that rules out the smaller KV type it says so and takes a residency or cap move instead."""

import numpy as np

from swarmtune.engine.backends.sim_backend import SimBackend
from swarmtune.engine.engine import Engine, EngineSettings
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.model.profiles import profile
from swarmtune.engine.quality.quality_check import QualityCheck, band_of
from swarmtune.engine.record.records import StepRecord
from swarmtune.engine.tune.events import Foreseen, Setting, event_from_json
from swarmtune.engine.tune.goal import Goal
from swarmtune.engine.tune.tuner import Tuner
from swarmtune.tui.stats import Stats
from swarmtune.tui.widgets.status import status_text
from tests.conftest import SIM

KV = KVSetting.parse


def _swarm(tool_latency_s: float, gen_tokens: int, quality: QualityCheck | None, goal: Goal) -> Engine:
    """The budget-filling swarm on the simulated RX 9070 XT at the seed's 55,000-token budget."""
    p = profile(SIM)
    s = EngineSettings(agents=8, batch_cap=8, kv=KV("f16"), residency="keep", seed=1, gen_tokens=gen_tokens,
                       tool_tokens=1024, ctx_per_agent=p.context_per_agent, kv_budget_bytes=p.kv_budget_bytes,
                       tool_latency_s=tool_latency_s, check=False)
    return Engine(SimBackend(p), s, tuner=Tuner(goal), autotune=True, quality=quality)


def _run(e: Engine, until_s: float) -> list[StepRecord]:
    out = []
    while e.now_s() < until_s:
        out.append(e.step())
    return out


def test_the_budget_line_comes_before_the_churn_and_weighs_each_way_out():
    goal = Goal(allowed_kv=(KV("f16"), KV("q8_0")), run_s=250.0, forecast_seeds=1)
    e = _swarm(5.0, 256, None, goal)
    recs = _run(e, 60.0)
    lines = [r.tune for r in recs if r.kind == "tune" and isinstance(r.tune, Foreseen)]
    assert lines, [r.note for r in recs if r.kind == "tune"]
    first = lines[0]
    at = next(r.t for r in recs if r.tune is first)
    preempted = [r.t for r in recs if r.preempted]
    assert not preempted or preempted[0] > at  # foreseen, not seen
    assert first.staying_reprefilled > 0 and first.budget_tokens == e.budget_tokens(KV("f16"))
    ways = {Setting.from_dict(w["to"]): w for w in first.ways}
    q8 = ways[Setting(8, KV("q8_0"), "keep")]
    assert q8["gain"] > 0 and q8["reprefilled"] < first.staying_reprefilled
    assert "KV budget: f16 budget full at" in first.why and "KV q8_0 +" in first.why
    assert first.weighing == Setting(8, KV("q8_0"), "keep") and first.why.endswith("weighing KV q8_0")
    assert event_from_json(first.to_json()) == first
    trial = next(r.tune for r in recs if r.kind == "tune" and r.tune is not None and r.tune.phase == "trial")
    assert trial.why.startswith("KV budget: f16 budget full at")
    # the dashboard's status line, where the user decides: the budget's outlook beside what the tuner tries
    stats = Stats(tuner_on=True)
    for r in recs[: recs.index(next(r for r in recs if r.tune is first)) + 2]:
        stats.add(r)
    line = status_text(stats, "", False).plain
    assert "trying KV q8_0; KV budget " in line and "the way out tried +" in line, line
    assert f"staying re-prefills {first.staying_reprefilled:,} (forecast)" in line, line


def test_a_quality_budget_that_rules_out_q8_0_leaves_a_residency_or_cap_move_never_q8_0():
    """q8_0 measured at 0.05 nats at every context band (a stand-in ledger: the sim has no logits), past a
    0.01 budget: the tuner says so in one line and moves residency or cap, never to q8_0."""
    q = QualityCheck(budget_share=0.0, wanted=(KV("q8_0"),))
    for k in range(1, 15):
        q.ledger.add(KV("q8_0"), band_of(2 ** k), np.full(200, 0.05), np.ones(200, dtype=bool))
    goal = Goal(allowed_kv=(KV("f16"), KV("q8_0")), run_s=TOOL_BOUND_RUN_S, kv_quality=0.01, forecast_seeds=1)
    e = _swarm(TOOL_BOUND_LATENCY_S, TOOL_BOUND_GEN, q, goal)
    recs = _run(e, TOOL_BOUND_RUN_S)
    assert all(r.kv_type == "f16" for r in recs)
    lines = [r.tune for r in recs if r.kind == "tune" and isinstance(r.tune, Foreseen)]
    assert lines and all(x.ruled_out is not None for x in lines), [r.note for r in recs if r.kind == "tune"]
    assert "rules out every smaller KV type" in lines[0].why and "q8_0: mean KL 0.0500 measured" in lines[0].why
    assert all(KV("q8_0") != Setting.from_dict(w["to"]).kv for x in lines for w in x.ways)
    moved = [r.tune for r in recs if r.kind == "tune" and r.tune is not None and r.tune.phase == "decided"]
    assert moved and all(d.to.kv == KV("f16") for d in moved)
    assert (e.s.residency, e.s.batch_cap) != ("keep", 8)


# a swarm whose agents wait long at tools: once the budget binds at f16, their histories are worth moving
# out of the cache while they wait (or fewer decoding at once), and the tuner finds it
TOOL_BOUND_LATENCY_S = 20.0
TOOL_BOUND_GEN = 128
TOOL_BOUND_RUN_S = 400.0

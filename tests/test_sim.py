"""The sim backend: the seed's tables, determinism, and the engine's scheduling on fast simulated steps."""

import json

import pytest

from swarmtune.engine.backends.sim_backend import SimBackend
from swarmtune.engine.control import Control
from swarmtune.engine.engine import Engine, EngineSettings
from swarmtune.engine.errors import UserError
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.measure.speedup import crossover_context, predicted_speedup
from swarmtune.engine.measure.sweep import run_sweep
from swarmtune.engine.model.profiles import PROFILES, profile
from tests.conftest import SIM, run_cli

KV = KVSetting.parse  # a KV setting as a flag spells it

SEED_TABLE = {2400: 5.6, 4700: 4.5, 6900: 3.8, 16000: 2.6, 55000: 1.6}


def test_seed_formula_and_crossover():
    w, k = 5.5e9, 147e3
    for ctx, s in SEED_TABLE.items():
        assert predicted_speedup(8, ctx, w, k) == pytest.approx(s, abs=0.1)
    assert crossover_context(8, w, k) == pytest.approx(4700, rel=0.02)
    assert predicted_speedup(8, 0, w, k) == 8


def test_sweep_reproduces_the_seed_table():
    r = run_sweep(SimBackend(profile(SIM)), KV("f16"), [1, 8], list(SEED_TABLE))
    got = {row.context: row.speedup for row in r.rows if row.batch == 8}
    for ctx, s in SEED_TABLE.items():
        assert got[ctx] == pytest.approx(s, abs=0.1)
    assert all(row.source == "simulated" for row in r.rows)


def test_sweep_cli_json_and_png(tmp_path):
    out = run_cli("sweep", "--sim", SIM, "--batch", "1,8", "--contexts", ",".join(map(str, SEED_TABLE)),
                  "--json", str(tmp_path / "s.json"), "--png", str(tmp_path / "s.png"))
    assert out.returncode == 0, out.stderr
    data = json.loads((tmp_path / "s.json").read_text())
    assert data["source"] == "simulated"
    rows = {(r["batch"], r["context"]): r for r in data["rows"]}
    for ctx, s in SEED_TABLE.items():
        r = rows[(8, ctx)]
        assert r["speedup"] == pytest.approx(s, abs=0.1)
        assert set(r) >= {"batch", "context", "tokens_per_second", "speedup", "predicted_speedup",
                          "calibrated_speedup", "source"}
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "5.62x" in out.stdout and "simulated" in out.stdout


def test_engine_is_deterministic_under_seed():
    def run(seed):
        p = profile(SIM)
        e = Engine(SimBackend(p), EngineSettings(seed=seed, ctx_per_agent=4096))
        recs = [e.step().to_json() for _ in range(400)]
        e.close()
        return recs
    assert run(3) == run(3)
    assert run(3) != run(4)


def test_contexts_grow_then_agents_start_fresh_tasks():
    e = Engine(SimBackend(profile(SIM)), EngineSettings(ctx_per_agent=1024, gen_tokens=32, tool_tokens=128))
    peak, fresh = 0, False
    for _ in range(3000):
        r = e.step()
        for a in r.agents:
            assert a.context <= a.limit
            peak = max(peak, a.context)
        fresh = fresh or any(a.turns == 0 and a.generated > 0 for a in r.agents)
    assert peak > 800 and fresh


def test_fair_rotation_under_a_batch_cap():
    e = Engine(SimBackend(profile(SIM)), EngineSettings(agents=6, batch_cap=2, ctx_per_agent=4096, reference=False))
    served = {i: 0 for i in range(6)}
    for _ in range(600):
        r = e.step()
        if r.kind == "decode":
            assert r.batch <= 2 and r.batch_cap == 2
            for i in r.batch_ids:
                served[i] += 1
    assert max(served.values()) - min(served.values()) <= max(served.values()) * 0.1


def test_kv_budget_preempts_the_longest_and_requeues_it(sim_engine):
    preempted = set()
    for _ in range(6000):
        r = sim_engine.step()
        used = sum(a.context for a in r.agents)
        assert used <= sim_engine.budget_tokens(sim_engine.s.kv)
        preempted.update(r.preempted)
    assert preempted  # 8 agents x 16k tokens do not fit the seed card's 55k-token budget
    # requeued agents come back and generate again
    assert all(a.generated > 0 for a in r.agents)


def test_kv_switch_rebuilds_and_reprefills(sim_engine):
    sim_engine.s.kv_convert = False
    for _ in range(200):
        sim_engine.step()
    live = sum(a.context for a in sim_engine.agents)
    state = sim_engine.request(Control(kv=KV("q8_0")))
    assert state.kv == KV("q8_0")
    r = sim_engine.step()
    assert r.kind == "rebuild" and r.kv_type == "q8_0" and r.tokens >= live - 8 and r.seconds > 0
    assert "f16 -> q8_0" in r.note
    r = sim_engine.step()
    assert r.kv_type == "q8_0"


def test_kv_switch_converts_the_cached_rows_at_a_modeled_cost(sim_engine):
    for _ in range(200):
        sim_engine.step()
    live = sum(a.context for a in sim_engine.agents if a.residency.value == "cache")
    sim_engine.request(Control(kv=KV("q8_0")))
    r = sim_engine.step()
    assert r.kind == "rebuild" and r.tokens == 0 and r.converted_tokens == live > 0
    converts = [m for m in r.moved if m.op == "convert"]
    assert converts and all(m.source == "modeled" and m.seconds > 0 for m in converts)
    assert r.residency_seconds > 0 and "converted" in r.note
    sim_engine.check_caches()
    for _ in range(20):
        assert sim_engine.step().kv_type == "q8_0"


def test_a_cache_type_the_build_refuses_keeps_the_old_one(sim_engine, monkeypatch):
    for _ in range(50):
        sim_engine.step()
    real_open = sim_engine.backend.open

    def picky_open(kv, n, ctx):
        if kv == KV("q4_0"):
            raise UserError("llama.cpp could not create a context with KV type q4_0 on this build")
        real_open(kv, n, ctx)

    monkeypatch.setattr(sim_engine.backend, "open", picky_open)
    sim_engine.request(Control(kv=KV("q4_0")))
    r = sim_engine.step()
    assert r.kind == "rebuild" and r.kv_type == "f16" and "q4_0 refused" in r.note
    assert r.refused_kv == "q4_0"  # the tuner learns it from the record: no candidate after this
    assert sim_engine.state().kv == KV("f16")
    for _ in range(20):
        r = sim_engine.step()
    assert r.kv_type == "f16" and r.kind in ("decode", "prefill")


def test_controls_validate_and_leave_the_engine_alone(sim_engine):
    sim_engine.step()
    with pytest.raises(UserError):
        sim_engine.request(Control(batch_cap=0))
    with pytest.raises(UserError):
        sim_engine.request(Control(batch_cap=99))
    with pytest.raises(UserError, match="unknown KV type 'fp8'"):  # read where it enters: never a Control
        sim_engine.request(Control.from_http({"kv_type": "fp8"}))
    assert sim_engine.state().batch_cap == 8 and sim_engine.state().kv == KV("f16")
    sim_engine.request(Control(batch_cap=3))
    r = sim_engine.step()
    assert r.batch_cap == 3


def test_adding_agents_beyond_the_streams_rebuilds(sim_engine):
    for _ in range(50):
        sim_engine.step()
    sim_engine.request(Control(agents=10))
    r = sim_engine.step()
    assert r.kind == "rebuild" and len(r.agents) == 10
    sim_engine.request(Control(agents=4))
    r = sim_engine.step()
    assert len(r.agents) == 4


def test_every_profile_lists():
    out = run_cli("profiles")
    assert out.returncode == 0
    for name in PROFILES:
        assert name in out.stdout


def test_sim_cache_is_as_strict_as_a_consistent_llama_cache():
    from swarmtune.engine.backends.backend import CacheMismatch

    b = SimBackend(profile(SIM))
    b.open(KV("f16"), 2, 64)
    b.steps.seed_sampler(0, 1)
    b.steps.prefill(0, [1, 2, 3], 0)
    assert b.cells.span(0) == (0, 2) and b.cells.span(1) == (-1, -1)
    with pytest.raises(CacheMismatch):
        b.steps.prefill(0, [4], 5)  # a gap
    with pytest.raises(CacheMismatch):
        b.steps.launch_decode([0], [4], [2])()  # overwriting a held position
    with pytest.raises(CacheMismatch):
        b.steps.launch_decode([1], [4], [7])()  # an empty sequence starts at 0
    b.steps.launch_decode([0], [4], [3])()
    assert b.cells.span(0) == (0, 3)
    b.cells.drop(0)
    with pytest.raises(CacheMismatch):
        b.steps.launch_decode([0], [5], [4])()  # after a drop, the old positions are gone


def test_sim_kv_switch_keeps_every_cache():
    p = profile(SIM)
    e = Engine(SimBackend(p), EngineSettings(agents=4, ctx_per_agent=4096, check=True))
    for _ in range(200):
        e.step()
    held = {a.id: a.context for a in e.agents}
    e.request(Control(kv=KV("q8_0")))
    r = e.step()
    # every history comes back (with the token each had sampled, and any tool result still pending)
    # (converted in place: engine/kv/convert.py; none prefilled again)
    assert r.kind == "rebuild" and r.tokens + r.converted_tokens == sum(a.context for a in e.agents)
    assert r.converted_tokens > 0
    assert all(a.context >= held[a.id] for a in e.agents)
    assert all(e.backend.cells.span(a.seq) == (0, a.context - 1) for a in e.agents)
    for _ in range(200):  # every step's check passes: decode positions follow each history
        e.step()


def test_reference_comes_from_the_run_not_a_probe():
    e = Engine(SimBackend(profile(SIM)), EngineSettings(agents=4, ctx_per_agent=4096))
    recs = [e.step() for _ in range(300)]
    ref = [r for r in recs if r.reference]
    assert ref and all(r.batch == 1 and r.kind == "decode" for r in ref)
    full = [r for r in recs if r.kind == "decode" and r.batch == 4 and r.step > ref[0].step]
    have = [r for r in full if r.measured_speedup is not None]
    # only steps just after a context jump (a tool result), before a reference step covers it, lack one
    assert len(have) >= 0.9 * len(full)
    # the sim's batch-1 steps are its roofline: the measured speedup is the formula's
    assert all(r.measured_speedup == pytest.approx(r.predicted_speedup, rel=0.01) for r in have)
    assert len(ref) < 0.1 * len([r for r in recs if r.kind == "decode"])


def test_reference_cadence_follows_its_measured_cost():
    """A batch-1 reference costs (t1/tB - 1/B) of a batch step: at batch 64 on the simulated card that is far
    less than at batch 4, so references come more often there, and at both they cost about 1% of the time."""
    gaps, shares = {}, {}
    for n in (4, 64):
        e = Engine(SimBackend(profile(SIM)), EngineSettings(agents=n, batch_cap=n, ctx_per_agent=4096))
        recs = [e.step() for _ in range(1500)][300:]  # past the warm-up, when references come every 8 steps
        dec = [r for r in recs if r.kind == "decode"]
        refs = [r for r in dec if r.reference]
        full = [r for r in dec if r.batch == n and not r.reference]
        t_batch = sum(r.seconds for r in full) / len(full)
        # what the references cost: their time less what their one token is worth at the batch's rate
        cost = sum(r.seconds - t_batch / n for r in refs)
        shares[n] = cost / sum(r.seconds for r in recs)
        gaps[n] = len(dec) / len(refs)
    assert gaps[64] < gaps[4] / 2
    assert all(0.003 < s < 0.015 for s in shares.values()), shares

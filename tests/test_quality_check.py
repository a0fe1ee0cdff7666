"""The live KV quality check: one agent's own history through a setting against f16/f16 while the swarm runs,
within its budget of the run's time; its ledger per context band; a tuner under a quality budget leaves a
setting measured past it and never picks one not measured within it."""

import re

import numpy as np
import pytest

from swarmtune.engine.control import Control
from swarmtune.engine.engine import Engine, EngineSettings
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.quality.kv_quality import kl_and_top1
from swarmtune.engine.quality.quality_check import CHECK_POSITIONS, QualityCheck, QualityLedger, band_of
from swarmtune.engine.quality.quality_texts import swarm_documents
from swarmtune.engine.tune.goal import Goal
from swarmtune.engine.tune.tuner import Tuner
from tests.conftest import SIM, run_cli

KV = KVSetting.parse  # a KV setting as a flag spells it


def test_a_figure_stands_for_its_band_of_context_only():
    assert band_of(700) == (512, 1024) and band_of(1024) == (1024, 2048) and band_of(3) == (2, 4)
    ledger = QualityLedger()
    ledger.add(KV("q8_0"), band_of(700), np.full(120, 0.004), np.ones(120, dtype=bool))
    assert ledger.mean_kl(KV("q8_0"), 900) == pytest.approx(0.004)
    assert ledger.mean_kl(KV("q8_0"), 1500) is None  # the contexts grew out of its band: stale, not a figure
    assert ledger.mean_kl(KV("q8_0/q8_0"), 600) == pytest.approx(0.004)  # one setting, two spellings
    assert ledger.mean_kl(KV("f16"), 5000) == 0.0  # the reference against itself
    assert ledger.within(KV("q8_0"), 700, 0.01) is True and ledger.within(KV("q8_0"), 700, 0.001) is False
    assert ledger.within(KV("q4_0"), 700, 0.01) is None
    ledger.add(KV("q4_0"), band_of(700), np.full(50, 0.05), np.ones(50, dtype=bool))
    assert ledger.mean_kl(KV("q4_0"), 700) is None  # fewer positions than a figure needs


def test_off_on_the_simulated_card(sim_engine):
    q = QualityCheck(budget_share=1.0, wanted=(KV("q8_0"),))
    assert not q.enabled(sim_engine)


def test_one_check_on_the_default_model(llama_backend):
    text = "def area(r):\n    return 3.14159 * r * r\n\n" * 40
    history = llama_backend.text.tokenize(text)[:300]
    q = QualityCheck()
    ev = q.check(llama_backend, KV("q4_0"), history, agent_id=3)
    assert ev.kv == KV("q4_0") and ev.context == 300 and ev.band == [256, 512] and ev.positions == CHECK_POSITIONS
    assert ev.check_kl > 0 and ev.check_s > 0 and q.spent_s == pytest.approx(ev.check_s, rel=0.01)
    assert ev.mean_kl is None and "a figure needs" in ev.why  # one check: too few positions yet
    ev = q.check(llama_backend, KV("q4_0"), history, agent_id=3)
    assert ev.positions == 2 * CHECK_POSITIONS and ev.mean_kl is not None and ev.mean_kl > 0
    assert q.ledger.mean_kl(KV("q4_0"), 300) == pytest.approx(ev.mean_kl, abs=1e-6)
    assert ev.to_json()["phase"] == "quality" and "measured" in ev.source


def _decoded(backend, kv: KVSetting, history: list[int], start: int) -> list:
    """The logits a live cache at kv produced, decoding history[start:] one token at a time."""
    backend.open(kv, 2, 512)
    backend.steps.seed_sampler(0, 1)
    backend.steps.prefill(0, history[:start], 0)
    backend.keep_logits(0, CHECK_POSITIONS)
    for p in range(start, len(history)):
        backend.steps.launch_decode([0], [history[p]], [p])()
    kept = list(backend.watch.kept)
    backend.keep_logits(None)
    return kept


def test_a_quantized_caches_own_logits_stand_for_one_side(llama_backend):
    """What a live q8_0 cache produced while decoding is what a q8_0 prefill computes, bit for bit: one side
    context (the reference) measures what two measure at the same positions."""
    history = swarm_documents(llama_backend, 1, 265)[0][:265]
    kept = _decoded(llama_backend, KV("q8_0"), history[:264], 200)
    assert [k.pos for k in kept] == list(range(200, 264)) and all(k.kv == KV("q8_0") for k in kept)
    one = QualityCheck().check(llama_backend, KV("q8_0"), history[:264], kept=kept)
    assert one.positions == CHECK_POSITIONS and "live q8_0 cache's own logits" in one.why and one.context == 264
    both = QualityCheck().check(llama_backend, KV("q8_0"), history)  # positions 200..263 through two contexts
    assert one.check_kl == pytest.approx(both.check_kl, abs=1e-6), (one.check_kl, both.check_kl)
    with pytest.raises(ValueError):
        QualityCheck().check(llama_backend, KV("q4_0"), history[:264], kept=kept)


def _computed(why: str) -> int:
    return int(re.search(r"(\d+) tokens computed", why).group(1))


def test_an_agents_side_contexts_are_held_and_compute_only_what_is_new(llama_backend):
    """A check of the same agent's grown history reuses what its side contexts hold, and measures what a
    fresh pair of contexts measures (the reference's rows in chunks of 64 or more, as before)."""
    history = swarm_documents(llama_backend, 1, 700)[0][:700]
    q = QualityCheck()
    try:
        first = q.check(llama_backend, KV("q8_0"), history[:500], agent_id=0, n_ctx=1024)
        again = q.check(llama_backend, KV("q8_0"), history, agent_id=0, n_ctx=1024)
    finally:
        q.close()
    assert _computed(first.why) == 2 * 500 and _computed(again.why) == 2 * 200
    fresh = QualityCheck().check(llama_backend, KV("q8_0"), history)
    assert _computed(fresh.why) == 2 * 700
    assert again.check_kl == pytest.approx(fresh.check_kl, abs=1e-6), (again.check_kl, fresh.check_kl)


def test_an_f16_decode_is_no_reference(llama_backend):
    """Why a swarm at f16 is checked through two side contexts: its own decode rows differ from the reference
    prefill's by about what q8_0 costs (llama.cpp's CPU flash attention rounds a one-row query to f16)."""
    history = swarm_documents(llama_backend, 1, 265)[0][:264]
    live = np.stack([k.logits for k in _decoded(llama_backend, KV("f16"), history, 200)])
    with llama_backend.new_scorer(KV("f16"), 264) as sc:
        prefilled = sc.logits(history, 200, at=list(range(200, 264)))
    kl, _ = kl_and_top1(prefilled, live)
    assert kl.mean() > 1e-5, kl.mean()


@pytest.fixture(scope="module")
def one_thread(model_path):
    """The default model on one thread, for the engine runs here: their checks wait on the engine's clock,
    and under the suite's -n 3 on 2 cores a 2-thread llama.cpp context spins at every barrier (3.5 s a
    decode step, measured) where one thread just shares the cores."""
    from swarmtune.engine.backends.llama_backend import LlamaBackend
    from swarmtune.engine.model.model_facts import read_model_facts

    b = LlamaBackend(read_model_facts(model_path), n_threads=1)
    yield b
    b.close()


def _engine(backend, kv: KVSetting, budget: float | None, share: float) -> Engine:
    s = EngineSettings(agents=4, kv=kv, ctx_per_agent=640, gen_tokens=24, tool_tokens=96, seed=3,
                       tool_latency_s=0.05)
    # no probe (a run under 600 s) and no look (epochs of 1,000 s): the quality budget alone moves it
    goal = Goal(allowed_kv=(KV("f16"), KV("q4_0")), kv_quality=budget, epoch_s=1000.0, run_s=300.0)
    return Engine(backend, s, tuner=Tuner(goal), autotune=True,
                  quality=QualityCheck(budget_share=share, wanted=goal.allowed_kv))


def test_a_tuner_under_a_budget_q4_0_exceeds_leaves_q4_0_and_never_holds_it_again(one_thread):
    """The default model's q4_0 costs ~0.045 nats (measured, docs/quality.md): past a 0.01 budget. Started at
    q4_0, the tuner leaves it once the live check has a figure, says why, and never goes back."""
    e = _engine(one_thread, KV("q4_0"), 0.01, share=1.0)
    kvs, notes = [], []
    while e.now_s() < 150 and "f16" not in kvs:
        r = e.step()
        kvs.append(r.kv_type)
        if r.kind == "tune":
            notes.append(r.note)
    assert "f16" in kvs, notes
    assert any("past the quality budget" in n and "back to f16" in n for n in notes), notes
    for _ in range(60):
        assert e.step().kv_type == "f16"
    assert e.tuner.candidates(e, Tuner.setting(e)) == [c for c in e.tuner.candidates(e, Tuner.setting(e))
                                                        if c.kv != KV("q4_0")]


def test_with_the_budget_off_the_check_still_measures_but_decides_nothing(one_thread):
    e = _engine(one_thread, KV("q4_0"), None, share=1.0)
    notes: list[str] = []
    # until two checks came (a figure needs two), or two and a half minutes of a loaded machine
    while e.now_s() < 150 and sum(n.startswith("quality check") for n in notes) < 2:
        r = e.step()
        if r.kind == "tune":
            notes.append(r.note)
    assert sum(n.startswith("quality check") for n in notes) >= 2, notes
    assert e.s.kv == KV("q4_0") and not any("quality budget" in n for n in notes)


def test_the_check_keeps_within_its_share_of_the_run(one_thread):
    e = _engine(one_thread, KV("q8_0"), None, share=0.25)
    e.tuner = None
    q = e.quality
    assert isinstance(q, QualityCheck)
    while e.now_s() < 90 and q.checks < 2:
        e.step()
    # checks came (the first on a history the share already covers), and a check starts only where its
    # expected cost keeps the share: the estimate (the engine's prefill rate, then the last check's) may be
    # off by a little, never by a whole check
    assert q.checks >= 1, (q.checks, e.now_s())
    assert q.spent_s <= 0.25 * e.now_s() * 1.5 + 1e-6, (q.spent_s, q.checks, e.now_s())
    assert q.expected_s(1000) is not None


@pytest.mark.parametrize("bad", ["-0.1", "nan", "inf", "lots"])
def test_a_bad_quality_budget_is_one_line(bad):
    r = run_cli("record", "--sim", SIM, "--kv-quality", bad, "-o", "/dev/null", "--steps", "2")
    assert r.returncode == 2 and "--kv-quality" in r.stderr and "Traceback" not in r.stderr


def test_off_is_a_budget_too(tmp_path):
    r = run_cli("record", "--sim", SIM, "--kv-quality", "off", "-o", str(tmp_path / "r.jsonl"), "--steps", "2")
    assert r.returncode == 0, r.stderr


def test_a_control_to_a_pair_reaches_the_live_check(one_thread):
    e = _engine(one_thread, KV("f16"), None, share=1.0)
    e.tuner = None
    for _ in range(10):
        e.step()
    e.request(Control(kv=KV("q8_0/f16")))
    seen: list[str] = []
    while e.now_s() < 90 and "q8_0/f16" not in seen:
        r = e.step()
        if r.kind == "tune" and r.tune is not None and r.tune.phase == "quality":
            seen.append(r.tune.to_json()["kv"])
    assert "q8_0/f16" in seen, seen

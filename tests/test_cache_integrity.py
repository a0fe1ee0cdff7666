"""After every control (KV switch both ways, cap change, agents added and removed, preemption under a KV
budget) each agent's cache holds exactly its history, and the model continues each agent's own text:
its next-token logits equal those of a fresh context prefilled with the same history.

The engine's own check (SWARMTUNE_CHECK, on in every test) runs after each step; these tests add the
logits, which a cache of the right length but the wrong content would fail."""

import numpy as np
import pytest

from swarmtune.engine.agents.agent import AgentState
from swarmtune.engine.backends.backend import CacheMismatch
from swarmtune.engine.control import Control
from swarmtune.engine.engine import Engine, EngineSettings
from swarmtune.engine.kv.types import KVSetting

KV = KVSetting.parse  # a KV setting as a flag spells it

pytestmark = pytest.mark.model

# the reference (interleaved batch-1 steps) stays on: it replaced the probe that wiped the caches
SETTINGS = dict(agents=4, ctx_per_agent=640, gen_tokens=16, tool_tokens=64)


def _kl_nats(got: np.ndarray, want: np.ndarray) -> float:
    """KL(want || got) of the next-token distributions: a constant logit offset (a different kernel path
    for decode than for prefill) costs nothing, a different context costs a lot."""
    lw, lg = want - np.logaddexp.reduce(want), got - np.logaddexp.reduce(got)
    return float(np.sum(np.exp(lw) * (lw - lg)))


# what rebuilding a cache by prefill instead of decode may change at each cache type's precision
TOLERANCE_NATS = {"f16": 0.02, "q8_0": 0.05, "q8_0/f16": 0.05, "f16/q8_0": 0.05}
KL_SEEN: list[tuple[str, float, float]] = []


def assert_each_agent_continues_its_own_text(e: Engine, fresh, most: int = 2,
                                             tolerance: dict[str, float] = TOLERANCE_NATS) -> int:
    """For the `most` longest-context agents ready to decode (a fresh prefill per agent is the cost);
    tolerance: the KL allowed per setting, on this model."""
    e.check_caches()
    checked = 0
    ready = [a for a in e.agents
             if a.state is AgentState.DECODE and a.next_token is not None and a.seq < e.backend.n_seqs]
    for a in sorted(ready, key=lambda x: -x.context)[:most]:
        got = e.backend.steps.next_logits(a.seq, a.next_token, a.context)
        fresh.open(e.s.kv, 1, e.s.ctx_per_agent)
        for i in range(0, a.context, fresh.max_chunk_tokens):
            fresh.steps.prefill(0, a.history[i : i + fresh.max_chunk_tokens], i)
        want = fresh.steps.next_logits(0, a.next_token, a.context)
        # and the comparison has teeth: the same token after an empty cache is another distribution
        fresh.open(e.s.kv, 1, e.s.ctx_per_agent)
        wiped = fresh.steps.next_logits(0, a.next_token, 0)
        kl, kl_wiped = _kl_nats(got, want), _kl_nats(wiped, want)
        KL_SEEN.append((e.s.kv, kl, kl_wiped))
        print(f"agent {a.id} kv {e.s.kv}: KL {kl:.5f} nats (wiped cache: {kl_wiped:.3f})")
        assert kl < tolerance[e.s.kv.label], f"agent {a.id}: its next-token distribution moved by {kl:.4f} nats"
        assert kl_wiped > 10 * tolerance[e.s.kv.label]
        checked += 1
    e.check_caches()
    return checked


def _run(e: Engine, steps: int) -> None:
    for _ in range(steps):
        e.step()


def test_kv_switch_both_ways_keeps_every_cache(llama_backend, fresh):
    """The re-prefill path (conversion off, or where it does not apply)."""
    e = Engine(llama_backend, EngineSettings(**SETTINGS, kv_convert=False))
    _run(e, 30)
    before = {a.id: a.context for a in e.agents}
    assert all(before.values())
    for kv in (KV("q8_0"), KV("f16")):
        e.request(Control(kv=kv))
        r = e.step()
        assert r.kind == "rebuild" and r.kv_type == kv.label
        # the rebuild re-prefilled every history, and nothing else touched the caches
        assert all(llama_backend.cells.span(a.seq) == (0, a.context - 1) for a in e.agents)
        assert r.tokens == sum(a.context for a in e.agents)
        assert assert_each_agent_continues_its_own_text(e, fresh) >= 2
        _run(e, 5)
        assert assert_each_agent_continues_its_own_text(e, fresh) >= 1
    assert all(a.context >= before[a.id] or a.tasks > 1 for a in e.agents)


def test_kv_switch_by_conversion_keeps_every_cache_without_a_prefill(llama_backend, fresh):
    """The cached K and V converted to the new type (engine/kv/convert.py): nothing prefilled again, every
    agent's next-token distribution within the type's tolerance of a fresh prefill at the new type."""
    e = Engine(llama_backend, EngineSettings(**SETTINGS))
    _run(e, 30)
    for kv in (KV("q8_0"), KV("f16"), KV("q8_0")):
        e.request(Control(kv=kv))
        r = e.step()
        assert r.kind == "rebuild" and r.kv_type == kv.label
        held = sum(a.context for a in e.agents if a.context)
        assert r.tokens == 0 and r.converted_tokens == held > 0, r.note
        assert "converted" in r.note and {m.op for m in r.moved} >= {"convert", "convert_save"}
        assert all(llama_backend.cells.span(a.seq) == (0, a.context - 1) for a in e.agents if a.context)
        assert assert_each_agent_continues_its_own_text(e, fresh) >= 2
        _run(e, 5)
        assert assert_each_agent_continues_its_own_text(e, fresh) >= 1


def test_a_mixed_k_v_switch_converts_each_to_its_own_type_and_keeps_every_cache(llama_backend, fresh):
    """K and V apart (q8_0/f16, then f16/q8_0, then back to f16): each converted to its own type, nothing
    prefilled again, every agent's next-token distribution as a fresh prefill's at that setting."""
    e = Engine(llama_backend, EngineSettings(**SETTINGS))
    _run(e, 30)
    for kv in (KV("q8_0/f16"), KV("f16/q8_0"), KV("f16")):
        e.request(Control(kv=kv))
        r = e.step()
        assert r.kind == "rebuild" and r.kv_type == kv.label and kv == e.s.kv == llama_backend.kv
        held = sum(a.context for a in e.agents if a.context)
        assert r.tokens == 0 and r.converted_tokens == held > 0, r.note
        # llama.cpp's own buffers at this setting: K and V each at its own type
        cached = sum(llama_backend.cache_bytes.values())
        modeled = sum(llama_backend.facts.bytes_model.llama_cpp_cache_bytes(
            kv, llama_backend.n_seqs, llama_backend.live.ctx_per_seq, llama_backend.max_chunk_tokens).values())
        assert cached == pytest.approx(modeled, rel=0.02), (kv, cached, modeled)
        assert assert_each_agent_continues_its_own_text(e, fresh) >= 2
        _run(e, 5)
        assert assert_each_agent_continues_its_own_text(e, fresh) >= 1
    e.request(Control(kv=KV("q8_0/q8_0")))  # one spelling for both: the same setting as q8_0
    assert e.step().kv_type == "q8_0"


def test_cap_change_and_agents_added_and_removed(llama_backend, fresh):
    e = Engine(llama_backend, EngineSettings(**SETTINGS))
    _run(e, 20)
    e.request(Control(batch_cap=2))
    _run(e, 10)
    assert all(r <= 2 for r in [e.step().batch for _ in range(6)])
    assert_each_agent_continues_its_own_text(e, fresh)
    e.request(Control(agents=6))  # more agents than streams: the context is rebuilt with room for them
    r = e.step()
    assert r.kind == "rebuild" and e.backend.n_seqs >= 6
    _run(e, 30)
    assert len(e.agents) == 6 and all(a.context > 0 for a in e.agents)
    assert_each_agent_continues_its_own_text(e, fresh)
    e.request(Control(agents=3))
    _run(e, 10)
    assert len(e.agents) == 3
    assert_each_agent_continues_its_own_text(e, fresh)


def test_preemption_under_a_kv_budget_keeps_the_rest(llama_backend, fresh):
    k = llama_backend.facts.kv_bytes_per_token(KV("f16"))
    e = Engine(llama_backend, EngineSettings(**{**SETTINGS, "kv_budget_bytes": 1100 * k}))
    preempted = 0
    for _ in range(160):
        preempted += len(e.step().preempted)
    assert preempted
    assert_each_agent_continues_its_own_text(e, fresh)


def test_the_check_catches_a_wiped_cache(llama_backend):
    e = Engine(llama_backend, EngineSettings(**SETTINGS))
    _run(e, 10)
    victim = next(a for a in e.agents if a.context)
    llama_backend.cells.drop(victim.seq)  # what the old probe did after a KV switch
    with pytest.raises(CacheMismatch, match=f"agent {victim.id}"):
        e.step()

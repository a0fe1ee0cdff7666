"""Agents that wait for tools, and where a waiting agent's history lives (keep, swap to host, drop).

On the real backend: a swap out and back leaves the sequence's cells and its next-token logits as they
were. On both backends: the engine's cache check (on in every test) holds through swaps, drops and a KV
switch with agents away, and a tool's latency takes agents out of the batch."""

import collections

import numpy as np
import pytest

from swarmtune.engine.agents.agent import AgentState, Residency
from swarmtune.engine.backends.sim_backend import SimBackend
from swarmtune.engine.control import Control
from swarmtune.engine.engine import Engine, EngineSettings
from swarmtune.engine.errors import UserError
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.model.profiles import profile
from tests.conftest import SIM, prefill_code
from tests.test_cache_integrity import assert_each_agent_continues_its_own_text

KV = KVSetting.parse  # a KV setting as a flag spells it


def _sim(residency: str, latency_s: float = 5.0, seed: int = 1) -> Engine:
    p = profile(SIM)
    return Engine(SimBackend(p), EngineSettings(agents=8, ctx_per_agent=p.context_per_agent,
                                                kv_budget_bytes=p.kv_budget_bytes, tool_latency_s=latency_s,
                                                residency=residency, seed=seed, check=True))


def _run_until(e: Engine, seconds: float) -> list:
    out = []
    while e.now_s() < seconds:
        out.append(e.step())
    return out


def test_tool_latency_takes_agents_out_of_the_batch_and_the_batch_rises_and_falls():
    e = _sim("keep")
    recs = _run_until(e, 120)
    batches = [r.batch for r in recs if r.kind == "decode" and not r.reference]
    assert min(batches) < 4 < max(batches), "the live batch should rise and fall on its own"
    tool_views = [v for r in recs for v in r.agents if v.state == "tool"]
    assert tool_views, "agents waiting for a tool show as their own state"
    # an agent waiting for a tool after one step is not in the next one's batch (its result, once back,
    # is prefilled before it decodes again)
    for before, r in zip(recs, recs[1:], strict=False):
        waiting = {v.id for v in before.agents if v.state == "tool"}
        assert not waiting & set(r.batch_ids if r.kind == "decode" else [])
    # the same seed draws the same latencies
    again = _run_until(_sim("keep"), 120)
    assert [(r.kind, r.batch_ids) for r in again] == [(r.kind, r.batch_ids) for r in recs]


def test_no_tool_latency_keeps_todays_behaviour(sim_engine):
    recs = [sim_engine.step() for _ in range(300)]
    assert not any(v.state == "tool" for r in recs for v in r.agents)
    assert not any(r.kind == "idle" for r in recs)


def test_every_agent_waiting_advances_the_simulated_clock_to_the_first_return():
    e = _sim("keep", latency_s=60.0)
    recs = _run_until(e, 300)
    idle = [r for r in recs if r.kind == "idle"]
    assert idle and all(r.seconds > 0 and r.tokens == 0 for r in idle)
    for r in idle:  # nothing could run: every agent was away
        assert all(v.state == "tool" for v in r.agents)


@pytest.mark.parametrize("residency", ["swap", "drop"])
def test_residency_moves_are_recorded_with_their_cost(residency):
    e = _sim(residency)
    recs = _run_until(e, 120)
    moves = [m for r in recs for m in r.moved]
    ops = collections.Counter(m.op for m in moves)
    if residency == "swap":
        assert ops["swap_out"] and ops["swap_in"]
        for m in moves:
            if m.op in ("swap_out", "swap_in"):
                assert m.bytes > 0 and m.seconds > 0 and m.source == "modeled"
        # the host link is the profile's: seconds = bytes / bandwidth
        link = profile(SIM).host_link_bytes_per_s
        assert all(abs(m.seconds - m.bytes / link) < 1e-9 for m in moves if m.op == "swap_out")
        views = [v for r in recs for v in r.agents if v.residency == "host"]
        assert views and all(v.state == "tool" for v in views)
    else:
        assert ops["drop"] and not ops["swap_out"]
        # a dropped history comes back by prefill
        assert sum(r.tokens for r in recs if r.kind == "prefill") > sum(
            r.tokens for r in _run_until(_sim("keep"), 120) if r.kind == "prefill")


def test_a_kv_switch_with_agents_swapped_out_keeps_every_cache_consistent():
    e = _sim("swap")
    _run_until(e, 60)
    assert any(a.residency is Residency.HOST for a in e.agents) or _run_until(e, 120)
    e.request(Control(kv=KV("q8_0")))
    _run_until(e, e.now_s() + 60)  # the check runs after every step
    assert e.s.kv == KV("q8_0")


def test_bad_residency_and_latency_are_one_line_errors():
    p = profile(SIM)
    with pytest.raises(UserError, match="residency must be one of keep, swap, drop"):
        Engine(SimBackend(p), EngineSettings(residency="elsewhere"))
    with pytest.raises(UserError, match="tool latency"):
        Engine(SimBackend(p), EngineSettings(tool_latency_s=float("nan")))


@pytest.mark.model
def test_swap_out_and_back_leaves_cells_and_logits_as_they_were(llama_backend):
    b = llama_backend
    tokens, nxt, cells_before, logits_before = prefill_code(b)
    handle, nbytes, seconds = b.cells.save_seq(0)
    assert nbytes > 0 and seconds >= 0
    b.cells.drop(0)
    assert b.cells.span(0) == (-1, -1)
    # the other sequence fills cells meanwhile, so the restored rows land elsewhere in the buffer
    b.steps.prefill(1, tokens[:64], 0)
    b.cells.restore_seq(0, handle)
    assert b.cells.span(0) == cells_before
    logits_after = b.steps.next_logits(0, nxt, len(tokens))
    assert np.argmax(logits_after) == np.argmax(logits_before)
    np.testing.assert_allclose(logits_after, logits_before, atol=1e-3)
    # and a state saved at one cache type is refused by another
    b.open(KV("q8_0"), 2, 512)
    from swarmtune.engine.backends.backend import CacheMismatch

    with pytest.raises(CacheMismatch):
        b.cells.restore_seq(0, handle)


@pytest.mark.model
@pytest.mark.parametrize("residency", ["swap", "drop"])
def test_real_engine_with_tool_waits_continues_each_agents_own_text(llama_backend, fresh, residency):
    """An agent whose history went to host memory (or was dropped) and came back continues its own text:
    its next-token logits equal a fresh prefill of the same history."""
    e = Engine(llama_backend, EngineSettings(agents=4, ctx_per_agent=640, gen_tokens=16, tool_tokens=64,
                                             tool_latency_s=0.2, tool_latency_sigma=0.5, residency=residency,
                                             seed=3, check=True))
    back_op = "swap_in" if residency == "swap" else "drop"
    returned: set[int] = set()
    for _ in range(3000):
        r = e.step()
        returned |= {m.agent for m in r.moved if m.op == back_op}
        ready = [a for a in e.agents if a.id in returned and a.state is AgentState.DECODE and a.next_token is not None]
        if ready and min(a.context for a in ready) > 100:
            break
    else:
        pytest.fail(f"no agent came back from {residency} and decoded")
    moves = [m for m in r.moved]
    assert all(m.source == "measured" for m in moves if m.op.startswith("swap"))
    assert assert_each_agent_continues_its_own_text(e, fresh, most=4) >= 1


def test_swapped_histories_past_the_host_bound_go_least_recently_served_first():
    from swarmtune.engine.agents.agent import Residency
    from swarmtune.engine.backends.sim_backend import SimBackend
    from swarmtune.engine.engine import Engine
    from swarmtune.engine.model.profiles import profile
    from swarmtune.engine.settings import EngineSettings
    from tests.conftest import SIM

    p = profile(SIM)
    e = Engine(SimBackend(p), EngineSettings(agents=4, ctx_per_agent=4096, residency="swap", tool_latency_s=5.0,
                                             tool_latency_sigma=0.1, swap_limit_bytes=1.0, check=True))
    moves = []
    for _ in range(400):
        moves += e.step().moved
    evicted = [m for m in moves if m.op == "swap_evicted"]
    assert evicted  # a 1-byte bound holds no swapped history
    assert all(a.residency is not Residency.HOST for a in e.agents)
    e.check_caches()

"""Overlap: the next decode step launched before a step's record goes to its readers. It changes when the
host does its work, never what the swarm does: the same records, token for token, with it on and off, on
the simulated card (with the tuner, controls, tool waits and a full KV budget) and on the real model; and a
pause holds only once the step launched ahead has landed."""

import json
import re
import threading

import pytest

from swarmtune.engine.backends.llama_backend import LlamaBackend
from swarmtune.engine.backends.sim_backend import SimBackend
from swarmtune.engine.control import Control
from swarmtune.engine.engine import Engine, EngineSettings
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.model.model_facts import read_model_facts
from swarmtune.engine.model.profiles import profile
from swarmtune.engine.tune.goal import Goal
from swarmtune.engine.tune.tuner import Tuner
from swarmtune.sources.live import LiveSource
from swarmtune.sources.protocol import Sink
from tests.conftest import SIM, until

KV = KVSetting.parse


def _sim(overlap: bool, tuner: bool) -> Engine:
    p = profile(SIM)
    s = EngineSettings(agents=8, ctx_per_agent=p.context_per_agent, gen_tokens=256, tool_tokens=1024,
                       kv_budget_bytes=p.kv_budget_bytes / 4, tool_latency_s=2.0, seed=3, check=True, overlap=overlap,
                       residency="swap")
    goal = Goal(allowed_kv=(KV("f16"), KV("q8_0")), epoch_s=10.0, horizon_s=120.0, forecast_seeds=1)
    return Engine(SimBackend(p), s, tuner=Tuner(goal) if tuner else None, autotune=tuner)


def _lines(e: Engine, steps: int, control_at: int | None = None) -> list[dict]:
    out = []
    for i in range(steps):
        if i == control_at:  # from another caller, between two steps
            e.request(Control(batch_cap=4))
        # the tuner's thinking in CPU seconds is the one measured figure in a simulated run's records
        line = re.sub(r'("think_cpu_s": ?)[0-9.]+', r"\g<1>0", e.step().to_json())
        out.append(json.loads(re.sub(r"[0-9.]+ CPU s", "", line)))
    e.close()
    return out


@pytest.mark.parametrize("tuner", [False, True])
def test_overlap_leaves_every_simulated_record_as_it_was(tuner):
    # the tuner's moves come from the hooks, which run before the next step is launched: the same steps
    off, on = (_lines(_sim(overlap, tuner), 1500) for overlap in (False, True))
    assert on == off
    kinds = {r["kind"] for r in on}
    assert {"decode", "prefill"} <= kinds
    assert any(r["preempted"] or r["moved"] for r in on)  # the budget binds: the hard case ran
    assert not tuner or "tune" in kinds


def test_a_control_from_another_caller_applies_to_the_first_step_launched_after_it():
    def first_at_cap_4(overlap: bool) -> tuple[int, list[dict]]:
        lines = _lines(_sim(overlap, tuner=False), 400, control_at=300)
        return next(r["step"] for r in lines if r["batch_cap"] == 4), lines

    at_off, off = first_at_cap_4(False)
    at_on, on = first_at_cap_4(True)
    assert at_off == 300
    assert at_on == 301  # step 300 was on the device when it came
    assert on[:300] == off[:300]


@pytest.mark.model
def test_overlap_on_the_real_model_samples_the_same_tokens(model_path):
    def run(overlap: bool) -> list[tuple]:
        # no batch-1 reference steps: their cadence follows measured step times, which differ between runs
        s = EngineSettings(agents=4, ctx_per_agent=512, gen_tokens=16, tool_tokens=64, seed=5, check=True,
                           overlap=overlap, reference=False)
        e = Engine(LlamaBackend(read_model_facts(model_path), n_threads=2), s)
        out = []
        for _ in range(80):
            r = e.step()
            out.append((r.kind, r.batch_ids, r.tokens, r.reference, [(a.context, a.tail) for a in r.agents]))
        assert e.in_flight == overlap  # on: the next decode is launched when a step returns
        e.close()  # lands it before its context goes
        return out

    off = run(False)
    assert run(True) == off
    assert sum(k == "decode" for k, *_ in off) > 40


def test_a_pause_holds_once_the_launched_step_has_landed_and_gone_out():
    e = _sim(overlap=True, tuner=False)
    e.backend.paced = True  # a device stand-in: each decode sleeps its modeled step
    assert e.overlap and e.header()["settings"]["overlap"] is True
    src = LiveSource(e, pace_sim=False)
    got: list = []
    stop = threading.Event()
    t = threading.Thread(target=src.run, args=(Sink(records=got.extend), stop.is_set), daemon=True)
    t.start()
    try:
        assert until(lambda: sum(r.kind == "decode" for r in got) >= 20)
        src.paused = True
        assert src.wait_held(10.0)
        assert not e.in_flight
        n = len(got)
        assert got[-1].step == e.step_index - 1  # every step run has gone out; none after the answer
        src.paused = False
        assert until(lambda: len(got) > n)
    finally:
        stop.set()
        t.join(10)
        e.close()


def test_the_paced_sim_launches_without_waiting_and_lands_its_tokens():
    p = profile(SIM)
    b = SimBackend(p)
    b.open(KV("f16"), 2, 64)
    b.steps.seed_sampler(0, 1)
    b.steps.seed_sampler(1, 1)
    b.paced = True
    assert b.caps.launches_async
    landing = b.steps.launch_decode([0, 1], [5, 6], [0, 0])
    assert b.cells.span(0) == (0, 0)  # the cells are the step's at launch, as llama.cpp's are once queued
    out, seconds = landing()
    assert len(out) == 2 and seconds == b.step_seconds(2, 2.0, contexts=[1.0, 1.0])


def test_a_control_between_the_overlaps_check_and_its_apply_has_its_rebuilds_record():
    """Issue 68's race: the overlap checks for a pending control, then applies controls; a KV switch requested
    between the two ran its rebuild, and the rebuild's record was dropped. Forced here: the request lands
    right after the check. The switch happens and a record says so."""
    e = _sim(overlap=True, tuner=False)
    for _ in range(20):
        e.step()
    real_take, calls = e.pending.take, []

    def take_then_request() -> Control:
        got = real_take()
        calls.append(got)
        if len(calls) == 1:  # the overlap's check has read nothing pending: now another thread asks
            e.request(Control(kv=KV("q8_0")))
        return got

    e.pending.take = take_then_request  # type: ignore[method-assign]
    while e.in_flight:  # land whatever was launched, so the next step() launches with our take in place
        e.step()
    calls.clear()
    records = [e.step() for _ in range(4)]
    e.pending.take = real_take  # type: ignore[method-assign]
    assert e.s.kv == KV("q8_0")  # the switch happened
    assert any(r.kind == "rebuild" for r in records), [r.kind for r in records]  # and its record came out
    e.close()

"""Real decode on the default model (SmolLM2-135M through llama.cpp): small, so it runs everywhere."""

import json

import pytest

from swarmtune.engine.backends.backend import NoKVSlot
from swarmtune.engine.control import Control
from swarmtune.engine.engine import Engine, EngineSettings
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.measure.probe import time_decode
from tests.conftest import run_cli

KV = KVSetting.parse  # a KV setting as a flag spells it

pytestmark = pytest.mark.model

SMALL = dict(agents=4, ctx_per_agent=512, gen_tokens=16, tool_tokens=64, reference=False)


def test_extra_buffer_types_are_off_by_default(llama_backend):
    # On AMX CPUs llama.cpp's default (on) crashed at load; the setting stays, the default is off.
    assert llama_backend.info.settings["use_extra_bufts"] is False


def test_batched_decode_runs_every_agent_in_one_call(llama_backend):
    e = Engine(llama_backend, EngineSettings(**SMALL))
    seen_decode = None
    for _ in range(120):
        r = e.step()
        assert r.source == "measured" and r.seconds > 0
        if r.kind == "decode" and r.batch == 4:
            seen_decode = r
    assert seen_decode is not None
    assert sorted(seen_decode.batch_ids) == [0, 1, 2, 3]
    assert seen_decode.tokens == 4
    assert seen_decode.weight_bytes == llama_backend.facts.weight_bytes
    tails = [a.tail for a in seen_decode.agents]
    assert all(t.strip() for t in tails)  # real text from the model
    assert len(set(tails)) > 1  # agents have their own tasks, samplers and logits rows


def test_same_seed_same_text(llama_backend):
    def run():
        e = Engine(llama_backend, EngineSettings(**{**SMALL, "seed": 7}))
        for _ in range(60):
            r = e.step()
        return [a.tail for a in r.agents]
    assert run() == run()


def test_no_kv_slot_is_a_scheduling_event(llama_backend):
    llama_backend.open(KV("f16"), 2, 256)
    llama_backend.steps.seed_sampler(0, 1)
    llama_backend.steps.prefill(0, [1] * 200, 0)
    with pytest.raises(NoKVSlot):
        llama_backend.steps.prefill(0, [1] * 100, 200)  # past its stream's 256 cells


def test_kv_switch_and_budget_on_the_real_model(llama_backend):
    e = Engine(llama_backend, EngineSettings(**{**SMALL, "kv_budget_bytes": 1000 * 23040}))
    preempted = False
    for _ in range(200):
        r = e.step()
        preempted = preempted or bool(r.preempted)
        assert sum(a.context for a in r.agents) <= e.budget_tokens(e.s.kv)
    assert preempted
    e.request(Control(kv=KV("q8_0")))
    r = e.step()
    assert r.kind == "rebuild" and r.kv_type == "q8_0"
    assert llama_backend.kv_buffer_bytes == pytest.approx(4 * 512 * 12240, abs=0.006 * 2**20)
    for _ in range(20):
        r = e.step()
    assert r.kv_type == "q8_0"


def test_copied_contexts_time_like_separate_ones(llama_backend):
    llama_backend.open(KV("f16"), 4, 1024)
    copied, separate = [], []
    for _ in range(3):  # alternated, the fastest of each: one slow round on a shared host is not the answer
        copied.append(time_decode(llama_backend, 4, 768, steps=10, copy=True).seconds_per_step)
        separate.append(time_decode(llama_backend, 4, 768, steps=10, copy=False).seconds_per_step)
    assert min(copied) == pytest.approx(min(separate), rel=0.25), (copied, separate)


def test_record_on_the_default_model(tmp_path):
    out = run_cli("record", "--agents", "3", "--ctx", "512", "--steps", "40", "--threads", "2",
                  "-o", str(tmp_path / "r.jsonl"))
    assert out.returncode == 0, out.stderr
    lines = (tmp_path / "r.jsonl").read_text().splitlines()
    h = json.loads(lines[0])
    assert h["source"] == "measured" and h["backend"] == "llama.cpp"
    assert h["kv_buffer_bytes_reported"] == pytest.approx(3 * 512 * h["kv_bytes_per_token"]["f16"], rel=0.001)
    assert h["settings"]["check"] is True  # the tests run every engine with the cache check on
    steps = [json.loads(x) for x in lines[1:]]
    assert len(steps) == 40
    # no startup probe: the batch-1 reference is timed by steps of the run itself
    ref = [s["step"] for s in steps if s["reference"]]
    assert ref and all(s["batch"] == 1 for s in steps if s["step"] in ref)
    dec = [s for s in steps if s["kind"] == "decode" and s["batch"] > 1 and s["step"] > ref[0]]
    assert dec and all(s["measured_speedup"] > 0 and s["calibrated_speedup"] > 0 for s in dec)


def test_a_penalised_sampler_draws(llama_backend):
    # the pinned bindings take the vocabulary's size first: a request with a presence or frequency penalty
    # raised a TypeError in the engine's thread
    from swarmtune.engine.conversation.sampling import SamplingParams

    b = llama_backend
    b.open(KV("f16"), 1, 256)
    b.steps.set_sampler(0, SamplingParams(seed=1, presence_penalty=0.5, frequency_penalty=0.2))
    b.steps.prefill(0, b.text.tokenize("Once upon a time"), 0)
    assert 0 <= b.steps.first_token_after_prefill(0) < b.n_vocab


def test_a_stall_bound_cuts_tool_results_into_chunks_the_fit_sizes(llama_backend):
    """On the real model: while others decode, each tool result's prefill runs in chunks cut to the bound (on
    these CPUs a 16-token chunk costs 20-60 ms, so 10 ms cuts every one to the 16-token floor), every
    cache holds its history after every step, and the cut chunks teach the fit a call's cost from a token's."""
    e = Engine(llama_backend, EngineSettings(**SMALL, max_stall_s=0.01, check=True))
    recs = [e.step() for _ in range(160)]
    cut = [r for r in recs if r.kind == "prefill" and r.note.startswith("stall bound")]
    assert cut and all(r.tokens <= 64 for r in cut)
    after = [r for r in cut if r.step > recs[0].step + 40]
    assert after and all(r.tokens == 16 for r in after), [r.note for r in after]
    fit = e.analysis.chunks[e.s.kv].fit
    assert fit is not None and fit.tokens_within(0.01, 0, 256) < 16
    assert sum(r.tokens for r in recs if r.kind == "decode") > 100

"""Byte accounting beyond dense models: sliding windows, experts, recurrent state.

The formulas on their own; tiny GGUFs of each family that llama.cpp loads and decodes batched, their facts
checked against what llama.cpp itself allocates; the simulated gpt-oss-20b against the dense formula.
"""

import ctypes
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tiny_gguf as tg
from conftest import ROOT

from swarmtune.engine.backends.llama_backend import caches_from_log
from swarmtune.engine.backends.sim_backend import SimBackend
from swarmtune.engine.control import Control
from swarmtune.engine.kv.types import KV_TYPES, KVSetting, read_kv
from swarmtune.engine.measure.speedup import crossover_context, predicted_speedup
from swarmtune.engine.measure.sweep import run_sweep
from swarmtune.engine.model.bytes_model import ByteModel, bytes_model_from_header
from swarmtune.engine.model.model_facts import read_model_facts
from swarmtune.engine.model.profiles import profile

KV = KVSetting.parse  # a KV setting as a flag spells it

MIB = 1024 * 1024
LOG_MIB = 0.005 * MIB + 1  # llama.cpp logs sizes in MiB with two decimals

# --- the formulas ---


@pytest.mark.parametrize("name", ["f16", "q8_0", "q4_0"])
def test_dense_model_is_the_seed_formula_exactly(name):
    w, values = 5.5e9, 73_500.0
    bm = ByteModel.dense(w, values)
    kv = KV(name)
    k = KV_TYPES[name].bytes_for(values)
    for b in (1, 2, 8, 32):
        for ctx in (0, 1, 2400, 4700, 55_000):
            assert bm.speedup(b, ctx, kv) == pytest.approx(predicted_speedup(b, ctx, w, k), rel=1e-12)
        assert bm.crossover_context(b, kv) == pytest.approx(crossover_context(b, w, k), rel=1e-12)
    assert bm.is_dense and bm.kind == "dense"


def test_seed_numbers_through_the_general_model():
    bm = profile("rx9070xt-qwen3.5-9b").bytes_model
    for ctx, s in ((2400, 5.6), (4700, 4.5), (6900, 3.8), (16000, 2.6), (55000, 1.6)):
        assert bm.speedup(8, ctx, KV("f16")) == pytest.approx(s, abs=0.1)
    assert bm.crossover_context(8, KV("f16")) == pytest.approx(4700, rel=0.02)


def _moe(n_layer: int = 4, e: int = 32, k: int = 4) -> ByteModel:
    return ByteModel(dense_weight_bytes=1e9, expert_bytes_per_layer=(1e7,) * n_layer, n_expert=e, n_expert_used=k,
                     kv_values_per_layer=(1000.0,) * n_layer, window_per_layer=(0,) * n_layer)


def test_experts_a_batch_touches_uniform_routing():
    bm = _moe()
    assert bm.expected_distinct_experts(1) == pytest.approx(4)
    assert bm.expected_distinct_experts(8) == pytest.approx(32 * (1 - (1 - 4 / 32) ** 8))
    assert bm.expected_distinct_experts(10_000) == pytest.approx(32)
    assert bm.weight_bytes(1) == pytest.approx(1e9 + 4 * 4 * 1e7)  # batch 1 reads the k it routes to
    assert bm.weight_bytes(10_000) == pytest.approx(bm.all_weight_bytes)
    # measured counts, one mean or one per MoE layer
    assert bm.weight_bytes(8, 10.0) == pytest.approx(1e9 + 10 * 4 * 1e7)
    assert bm.weight_bytes(8, [8, 9, 10, 11]) == pytest.approx(1e9 + 38 * 1e7)
    # batching shares less of the weight stream: at L = 0 the speedup is W(1) B / W(B), well under B
    s0 = bm.speedup(8, 0, KV("f16"))
    assert s0 == pytest.approx(8 * bm.weight_bytes(1) / bm.weight_bytes(8))
    assert 1 < s0 < 8
    assert bm.is_moe and not bm.is_dense


def test_windowed_layers_read_at_most_their_window():
    full, swa = 2000.0, 3000.0  # f16 values per token per layer
    bm = ByteModel(dense_weight_bytes=2e9, kv_values_per_layer=(swa, full, swa, full),
                   window_per_layer=(128, 0, 128, 0))
    per_tok = {name: 2 * 2 * v for name, v in (("full", full), ("swa", swa))}  # two layers each, 2 bytes a value
    assert bm.kv_read_bytes(KV("f16"), 100) == pytest.approx(100 * (per_tok["full"] + per_tok["swa"]))
    assert bm.kv_read_bytes(KV("f16"), 10_000) == pytest.approx(10_000 * per_tok["full"] + 128 * per_tok["swa"])
    assert bm.kv_bytes_per_token(KV("f16"), windowed=False) == per_tok["full"]
    # L*: the private read equals the shared one, found on the right piece of K(L)
    for b in (1, 8, 64):
        cross = bm.crossover_context(b, KV("f16"))
        assert bm.kv_read_bytes(KV("f16"), cross) == pytest.approx(bm.weight_bytes(b) / b, rel=1e-9)
    # the same KV without windows decays faster
    dense = ByteModel.dense(2e9, 2 * (full + swa))
    assert bm.speedup(8, 50_000, KV("f16")) > dense.speedup(8, 50_000, KV("f16"))
    assert bm.speedup(8, 64, KV("f16")) == pytest.approx(dense.speedup(8, 64, KV("f16")))
    # every layer windowed: the KV read stops growing and never catches up with the weights
    capped = ByteModel(dense_weight_bytes=2e9, kv_values_per_layer=(swa,), window_per_layer=(128,))
    assert math.isinf(capped.crossover_context(8, KV("f16")))
    # what an agent's cache holds, swa_full off: a window plus up to one ubatch on the windowed layers
    assert bm.kv_cache_bytes(KV("f16"), 10_000, swa_slack_tokens=64) == pytest.approx(
        10_000 * per_tok["full"] + 192 * per_tok["swa"])


def test_recurrent_state_is_read_whatever_the_context():
    s = 50e6
    bm = ByteModel(dense_weight_bytes=1e9, kv_values_per_layer=(0.0,), window_per_layer=(0,), state_bytes=s)
    assert bm.speedup(8, 0, KV("f16")) == pytest.approx(8 * (1e9 + s) / (1e9 + 8 * s))
    assert bm.speedup(8, 100_000, KV("f16")) == pytest.approx(bm.speedup(8, 0, KV("f16")))
    assert math.isinf(bm.crossover_context(8, KV("f16")))
    assert bm.crossover_context(100, KV("f16")) == 0.0  # s > W/B: private already the larger read at L = 0
    assert bm.kind == "recurrent state"


def test_kv_budget_pays_fixed_parts_first():
    bm = ByteModel(dense_weight_bytes=1e9, kv_values_per_layer=(1000.0, 1000.0), window_per_layer=(100, 0),
                   state_bytes=1000.0)
    # 4 agents x (state 1,000 + window 100 x 2,000 B) fixed, then 2,000 B per full-attention token
    assert bm.budget_tokens(1e6, KV("f16"), 4, 4096) == int((1e6 - 4 * (1000 + 100 * 2000)) // 2000)
    assert bm.budget_tokens(1e3, KV("f16"), 4, 4096) == 0
    windows_only = ByteModel(dense_weight_bytes=1e9, kv_values_per_layer=(1000.0,), window_per_layer=(100,))
    assert windows_only.budget_tokens(1e9, KV("f16"), 4, 4096) == 4 * 4096


def test_byte_model_round_trips_through_json_and_old_headers():
    bm = profile("rx9070xt-gpt-oss-20b").bytes_model
    back = ByteModel.from_dict(json.loads(json.dumps(bm.to_dict())))
    assert back == bm
    assert bytes_model_from_header({"bytes_model": bm.to_dict()}) == bm
    old = bytes_model_from_header({"weight_bytes": 5.5e9, "kv_bytes_per_token": {"f16": 147e3, "q8_0": 78_093.75}})
    assert old is not None and old.is_dense
    assert old.speedup(8, 4700, KV("q8_0")) == pytest.approx(predicted_speedup(8, 4700, 5.5e9, 78_093.75))
    assert bytes_model_from_header({}) is None


def test_caches_from_log_reads_each_cache():
    lines = [
        "llama_kv_cache_iswa: creating non-SWA KV cache, size = 1024 cells\n",
        "llama_kv_cache: size =    2.00 MiB (  1024 cells,   1 layers,  4/4 seqs), K (f16): 1.00 MiB, ...\n",
        "llama_kv_cache_iswa: creating     SWA KV cache, size = 256 cells\n",
        "llama_kv_cache: size =    2.50 MiB (   256 cells,   5 layers,  4/4 seqs), K (f16): 1.25 MiB, ...\n",
        "llama_memory_recurrent: size =    1.05 MiB (     4 cells,   4 layers,  4 seqs  0 rs_seq), R (f32): ...\n",
    ]
    assert caches_from_log(lines) == {"kv": 2 * MIB, "kv_swa": int(2.5 * MIB), "recurrent": int(round(1.05 * MIB))}


# --- tiny GGUFs, loaded and decoded by llama.cpp ---

FAMILIES = {
    "gemma3": tg.gemma3_swa,  # sliding window, 5:1
    "qwen3moe": tg.qwen3moe,  # experts
    "gpt-oss": tg.gpt_oss,  # experts + sliding window, untied head
    "mamba": tg.mamba,  # recurrent
    "lfm2": tg.lfm2,  # hybrid: short convolutions + attention
}
N_SEQS, CTX, CHUNK, PROMPT = 4, 1024, 64, 150


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("tiny")
    return {name: make(d / f"{name}.gguf") for name, make in FAMILIES.items()}


def test_tiny_facts_follow_llama_cpp_layer_rules(tiny_models):
    g = read_model_facts(tiny_models["gemma3"]).bytes_model
    assert g.window_per_layer == (64, 64, 64, 64, 64, 0)  # gemma3: pattern 6, the last of each six global
    o = read_model_facts(tiny_models["gpt-oss"]).bytes_model
    assert o.window_per_layer == (64, 0, 64, 0) and o.is_moe and o.embd_row_bytes > 0
    assert (o.n_expert, o.n_expert_used) == (8, 2)
    m = read_model_facts(tiny_models["mamba"]).bytes_model
    d_inner, d_state, d_conv = 2 * tg.N_EMBD, 64, 4
    assert m.state_bytes == 4 * 4 * ((d_conv - 1) * d_inner + d_state * d_inner)  # 4 layers, f32 r + s rows
    assert m.kv_bytes_per_token(KV("f16")) == 0
    lf = read_model_facts(tiny_models["lfm2"]).bytes_model
    assert [v > 0 for v in lf.kv_values_per_layer] == [i in tg.LFM2_ATTENTION_LAYERS for i in range(6)]
    assert lf.state_bytes == 4 * 4 * tg.N_EMBD * (17 - 1)  # four conv layers, l_cache - 1 columns of history


@pytest.mark.parametrize("family", list(FAMILIES))
def test_tiny_model_loads_decodes_batched_and_matches_llama_cpp(tiny_models, family):
    import llama_cpp as ll

    from swarmtune.engine.backends.llama_backend import LlamaBackend

    facts = read_model_facts(tiny_models[family])
    bm = facts.bytes_model
    # every tensor byte is accounted for: always-read, experts, embedding rows
    rows = tg.VOCAB if bm.embd_row_bytes else 0
    assert bm.all_weight_bytes + rows * bm.embd_row_bytes == pytest.approx(facts.tensor_bytes)
    b = LlamaBackend(facts, n_threads=1, chunk_tokens=CHUNK, measure_routing=bm.is_moe)
    try:
        assert ll.llama_model_size(b.model) == facts.tensor_bytes
        b.open(KV("f16"), N_SEQS, CTX)
        expected = {k: v for k, v in bm.llama_cpp_cache_bytes(KV("f16"), N_SEQS, CTX, CHUNK).items() if v}
        assert b.cache_bytes.keys() == expected.keys()
        for name, nbytes in expected.items():
            assert b.cache_bytes[name] == pytest.approx(nbytes, abs=LOG_MIB), name
        # a prompt longer than a window plus a ubatch, so windowed layers prune cells as they go; copied to the
        # other sequences (each memory type's seq_cp), which then decode tokens of their own
        prompt = [(3 * i) % 250 + 3 for i in range(PROMPT)]
        for i in range(0, PROMPT, CHUNK):
            b.steps.prefill(0, prompt[i : i + CHUNK], i)
        seqs = list(range(N_SEQS))
        for s in seqs:
            b.steps.seed_sampler(s, s)
            if s:
                b.cells.copy(0, s)
        toks = [10 + 40 * s for s in seqs]
        for step in range(3):
            toks, seconds = b.steps.launch_decode(seqs, toks, [PROMPT + step] * N_SEQS)()
            assert len(toks) == N_SEQS and all(0 <= t < tg.VOCAB for t in toks) and seconds > 0
            if bm.is_moe:
                d = b.watch.last_distinct_experts
                n_moe = sum(1 for x in bm.expert_bytes_per_layer if x > 0)
                assert d is not None and len(d) == n_moe
                assert all(bm.n_expert_used <= x <= min(bm.n_expert, N_SEQS * bm.n_expert_used) for x in d)
        first, last = b.cells.span(0)  # a recurrent memory keeps its last position only
        assert last == PROMPT + 2 and (bm.state_bytes > 0 or first == 0)
    finally:
        b.close()


def test_moe_routing_is_off_unless_asked(tiny_models):
    from swarmtune.engine.backends.llama_backend import LlamaBackend

    b = LlamaBackend(read_model_facts(tiny_models["qwen3moe"]), n_threads=1, chunk_tokens=CHUNK)
    try:
        assert b.routing is None and b.info.settings["moe_routing"] == "modeled"
        b.open(KV("f16"), 2, 256)
        b.steps.seed_sampler(0, 0)
        b.steps.seed_sampler(1, 1)
        b.steps.launch_decode([0, 1], [5, 6], [0, 0])()
        assert b.watch.last_distinct_experts is None
    finally:
        b.close()


def test_routing_counter_reads_this_builds_tensor_layout():
    from swarmtune.engine.backends.moe_routing import GgmlTensor

    assert ctypes.sizeof(GgmlTensor) == 336  # GGML_TENSOR_SIZE on 64-bit, ggml.h of the vendored llama.cpp


# --- the simulated MoE + sliding-window model ---


def test_gpt_oss_sim_curve_differs_from_the_dense_formula_as_the_physics_says():
    p = profile("rx9070xt-gpt-oss-20b")
    backend = SimBackend(p)
    res = run_sweep(backend, KV("f16"), [1, 8], [0, 2400, 16000, 55000], steps=2)
    rows = {r.context: r for r in res.rows if r.batch == 8}
    for r in rows.values():
        # the sim's steps read the model's bytes (timed a few tokens past the context, hence the tolerance)
        assert r.speedup == pytest.approx(r.predicted_speedup, rel=1e-3)
    # experts: a batch of 8 reads ~21 of 32 experts a layer, so even at L = 0 the speedup is far from 8
    assert rows[0].predicted_speedup < 0.5 * rows[0].dense_formula_speedup
    # windows: half the layers stop growing at 128 tokens, so the curve decays more slowly
    keep = rows[55000].predicted_speedup / rows[0].predicted_speedup
    keep_dense = rows[55000].dense_formula_speedup / rows[0].dense_formula_speedup
    assert keep > keep_dense
    assert res.bytes_model["n_expert"] == 32 and res.source == "simulated"


def test_cli_sweep_prints_the_moe_swa_curve_beside_the_dense_formula():
    r = subprocess.run([sys.executable, "-m", "swarmtune", "sweep", "--sim", "rx9070xt-gpt-oss-20b", "--batch", "1,8",
                        "--contexts", "0,16000", "--steps", "2"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env={**os.environ, "COLUMNS": "250"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "MoE + sliding window (modeled)" in r.stdout and "dense formula (modeled)" in r.stdout
    assert "8-agent speedup (simulated)" in r.stdout and "published config" in r.stdout
    cells = {int(c[0].replace(",", "")): c for line in lines
             if len(c := [x.strip() for x in line.strip("│ ").split("│")]) >= 5 and c[0].replace(",", "").isdigit()}
    sim, model, dense = (float(cells[0][i].rstrip("x")) for i in (2, 3, 4))
    assert sim == pytest.approx(model, abs=0.02) and model < 0.5 * dense  # experts: far from 8x at L = 0
    long_sim, long_dense = float(cells[16000][2].rstrip("x")), float(cells[16000][4].rstrip("x"))
    assert long_sim / sim > long_dense / dense  # windows: a slower decay


# --- the engine on each family: the cache check holds past the window, across a KV switch ---

@pytest.mark.parametrize("family", ["gemma3", "mamba", "gpt-oss"])
def test_engine_keeps_every_cache_on_each_family(tiny_models, family):
    from swarmtune.engine.backends.llama_backend import LlamaBackend
    from swarmtune.engine.engine import Engine, EngineSettings

    b = LlamaBackend(read_model_facts(tiny_models[family]), n_threads=1, chunk_tokens=CHUNK)
    try:
        e = Engine(b, EngineSettings(agents=2, ctx_per_agent=512, gen_tokens=16, tool_tokens=64, check=True))
        for _ in range(40):
            e.step()
        assert max(a.context for a in e.agents) > 64  # past the tiny models' window
        e.request(Control(kv=KV("q8_0")))
        assert e.step().kind == "rebuild"
        for _ in range(10):
            e.step()  # each step checks every cache
    finally:
        b.close()


def test_a_model_without_a_template_speaks_its_family_format(tiny_models):
    from swarmtune.engine.backends.llama_backend import LlamaBackend

    msgs = [{"role": "user", "content": "hi"}]
    gemma = LlamaBackend(read_model_facts(tiny_models["gemma3"]), n_threads=1)
    try:
        assert "built-in 'gemma'" in gemma.info.settings["chat_template"]
        assert gemma.text.chat(msgs, add_assistant=True).startswith("<start_of_turn>user\nhi<end_of_turn>")
    finally:
        gemma.close()
    mamba = LlamaBackend(read_model_facts(tiny_models["mamba"]), n_threads=1)
    try:
        assert mamba.info.settings["chat_template"].startswith("ChatML")  # llama.cpp has none for mamba
        assert mamba.text.chat(msgs, add_assistant=True).startswith("<|im_start|>user\nhi<|im_end|>")
    finally:
        mamba.close()


def test_an_attached_engine_s_unknown_cache_type_is_counted_at_f16(tiny_models):
    """llama-server and vLLM do not say their cache type ("remote"): the panels count it at f16, from the
    GGUF's byte model or from the W and k flags alike."""
    from swarmtune.tui.widgets.plots import bytes_known

    bm = read_model_facts(tiny_models["gemma3"]).bytes_model
    from_gguf = bytes_known({"bytes_model": bm.to_dict(), "weight_bytes": bm.weight_bytes(1)}, read_kv("remote"))
    assert from_gguf is not None and from_gguf.has_swa
    from_flags = bytes_known({"weight_bytes": 5.5e9, "kv_bytes_per_token": {"remote": 147e3}}, read_kv("remote"))
    assert from_flags is not None and from_flags.speedup(8, 2400, KV("f16")) == pytest.approx(5.6, abs=0.1)


def test_the_fit_counts_what_attention_reads():
    """The step-time fit's KV term is in the tokens attention reads: the context itself on a dense model,
    fewer past a window (half of gpt-oss-20b's layers read at most 128)."""
    from swarmtune.engine.model.bytes_model import ByteModel
    from swarmtune.engine.model.profiles import profile

    dense = ByteModel.dense(5.5e9, 147e3 / 2)
    assert [dense.kv_equivalent_tokens(KV("f16"), c) for c in (0, 100, 5000)] == [0, 100, 5000]
    oss = profile("rx9070xt-gpt-oss-20b").bytes_model
    assert oss.kv_equivalent_tokens(KV("f16"), 100) == pytest.approx(100)  # inside the window: every layer reads L
    full = oss.kv_bytes_per_token(KV("f16"), windowed=False) / oss.kv_bytes_per_token(KV("f16"))
    assert oss.kv_equivalent_tokens(KV("f16"), 4000) == pytest.approx(4000 * full + 128 * (1 - full))

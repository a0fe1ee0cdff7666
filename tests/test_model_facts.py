import numpy as np
import pytest
from gguf import GGUFWriter

from swarmtune.engine.errors import UserError
from swarmtune.engine.kv.types import KV_TYPES, KVSetting
from swarmtune.engine.model.model_facts import read_model_facts

KV = KVSetting.parse  # a KV setting as a flag spells it


def test_default_model_weight_and_kv_bytes(model_path):
    f = read_model_facts(model_path)
    assert (f.n_layer, f.n_head, f.n_head_kv_per_layer[0], f.head_dim_k, f.head_dim_v) == (30, 9, 3, 64, 64)
    assert f.tied_output  # SmolLM2 ties its output head to token_embd: the whole matrix is read every step
    assert f.weight_bytes == f.tensor_bytes
    assert f.kv_bytes_per_token(KV("f16")) == 30 * 3 * 128 * 2
    assert f.kv_bytes_per_token(KV("q8_0")) == 30 * 3 * 128 * 34 / 32
    assert f.kv_bytes_per_token(KV("q4_0")) == 30 * 3 * 128 * 18 / 32


@pytest.mark.parametrize("name", ["f16", "q8_0", "q4_0", "bf16", "q5_1"])
def test_kv_bytes_match_llama_cpp_buffer(llama_backend, name):
    kv = KV(name)
    llama_backend.open(kv, 2, 512)
    expected = 2 * 512 * llama_backend.facts.kv_bytes_per_token(kv)
    # llama.cpp logs the size in MiB with two decimals
    assert llama_backend.kv_buffer_bytes == pytest.approx(expected, abs=0.006 * 1024 * 1024)


def _tiny_gguf(path, tied: bool):
    w = GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_context_length(256)
    w.add_tensor("token_embd.weight", np.zeros((100, 64), dtype=np.float32))
    if not tied:
        w.add_tensor("output.weight", np.zeros((100, 64), dtype=np.float32))
    w.add_tensor("blk.0.attn_q.weight", np.zeros((64, 64), dtype=np.float32))
    w.add_tensor("output_norm.weight", np.zeros((64,), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_untied_embedding_counts_only_looked_up_rows(tmp_path):
    _tiny_gguf(tmp_path / "u.gguf", tied=False)
    f = read_model_facts(tmp_path / "u.gguf")
    row = 64 * 4
    assert not f.tied_output
    assert f.embd_row_bytes == row
    assert f.weight_bytes == (100 * 64 + 64 * 64 + 64) * 4  # output head, block, norm; not token_embd
    assert f.step_weight_bytes(8) == f.weight_bytes + 8 * row
    assert f.kv_bytes_per_token(KV("f16")) == 2 * 2 * (16 + 16) * 2


def test_tied_embedding_counts_in_full(tmp_path):
    _tiny_gguf(tmp_path / "t.gguf", tied=True)
    f = read_model_facts(tmp_path / "t.gguf")
    assert f.tied_output and f.embd_row_bytes == 0
    assert f.weight_bytes == (100 * 64 + 64 * 64 + 64) * 4


def test_bad_model_files(tmp_path):
    with pytest.raises(UserError, match="not found"):
        read_model_facts(tmp_path / "missing.gguf")
    (tmp_path / "x.gguf").write_bytes(b"not a model at all")
    with pytest.raises(UserError, match="not a GGUF"):
        read_model_facts(tmp_path / "x.gguf")
    _tiny_gguf(tmp_path / "t.gguf", tied=True)
    data = (tmp_path / "t.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) - 5000])
    with pytest.raises(UserError, match="truncated|unreadable"):
        read_model_facts(tmp_path / "cut.gguf")
    (tmp_path / "head.gguf").write_bytes(data[:40])
    with pytest.raises(UserError):
        read_model_facts(tmp_path / "head.gguf")


def test_every_kv_type_has_a_cost():
    assert {"f16", "q8_0", "q4_0"} <= set(KV_TYPES)
    assert KV_TYPES["q8_0"].bytes_for(32) == 34 and KV_TYPES["q4_0"].bytes_for(32) == 18


def test_the_header_reader_reads_what_ggufs_own_reader_does(tmp_path, model_path):
    """engine/model/gguf_header.py against gguf's GGUFReader: every field's contents (string arrays, bools,
    per-layer numbers, an alignment of its own) and every tensor's name, shape, bytes and offset."""
    from gguf import GGMLQuantizationType, GGUFReader
    from gguf.quants import quantize

    from swarmtune.engine.model.gguf_header import GGUFHeader

    w = GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    w.add_custom_alignment(64)
    w.add_block_count(3)
    w.add_array("llama.attention.head_count_kv", [2, 0, 4])
    w.add_array("llama.attention.sliding_window_pattern", [True, False, True])
    w.add_array("tokenizer.ggml.tokens", ["a", "ünï", "", "<|im_end|>"])
    w.add_array("tokenizer.ggml.scores", [0.5, -1.0, 0.0, 2.25])
    w.add_string("general.name", "tiny ✓")
    w.add_float64("x.f64", 1e-300)
    w.add_int64("x.i64", -(2**40))
    w.add_bool("x.bool", True)
    w.add_tensor("a", np.zeros((3, 64), dtype=np.float32))
    w.add_tensor("b", np.zeros((2, 32), dtype=np.float16))
    q4 = quantize(np.zeros((4, 64), dtype=np.float32), GGMLQuantizationType.Q4_0)
    w.add_tensor("q", q4, raw_dtype=GGMLQuantizationType.Q4_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    for path in (tmp_path / "m.gguf", model_path):
        theirs, mine = GGUFReader(path), GGUFHeader(path)
        keys = {k for k in theirs.fields if not k.startswith("GGUF.")}  # its own pseudo-fields: the header's counts
        assert keys == set(mine.fields)
        for k in keys:
            assert mine.fields[k].contents() == theirs.fields[k].contents(), k
        want = [(t.name, t.shape.tolist(), t.tensor_type, int(t.n_bytes), int(t.data_offset)) for t in theirs.tensors]
        assert want == [(t.name, t.shape.tolist(), t.tensor_type, t.n_bytes, t.data_offset) for t in mine.tensors]

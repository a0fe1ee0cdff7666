import numpy as np
import pytest
from gguf import GGUFWriter

from swarmtune.engine.errors import UserError
from swarmtune.engine.kv_types import KV_TYPES
from swarmtune.engine.model_facts import read_model_facts


def test_default_model_weight_and_kv_bytes(model_path):
    f = read_model_facts(model_path)
    assert (f.n_layer, f.n_head, f.n_head_kv_per_layer[0], f.head_dim_k, f.head_dim_v) == (30, 9, 3, 64, 64)
    assert f.tied_output  # SmolLM2 ties its output head to token_embd: the whole matrix is read every step
    assert f.weight_bytes == f.tensor_bytes
    assert f.kv_bytes_per_token("f16") == 30 * 3 * 128 * 2
    assert f.kv_bytes_per_token("q8_0") == 30 * 3 * 128 * 34 / 32
    assert f.kv_bytes_per_token("q4_0") == 30 * 3 * 128 * 18 / 32


@pytest.mark.parametrize("kv", ["f16", "q8_0", "q4_0", "bf16", "q5_1"])
def test_kv_bytes_match_llama_cpp_buffer(llama_backend, kv):
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
    assert f.kv_bytes_per_token("f16") == 2 * 2 * (16 + 16) * 2


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

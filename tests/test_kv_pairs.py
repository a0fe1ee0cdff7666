"""K and V types apart: one spelling for both (q8_0) and a pair (q8_0/f16, K first) everywhere a KV type is
taken; the byte model counts each at its own type; the flags printed for other engines say them apart."""

import pytest

from swarmtune.engine.control import Control
from swarmtune.engine.errors import UserError
from swarmtune.engine.kv.convert import rotation
from swarmtune.engine.kv.types import KV_TYPES, KVSetting, parse_kv_list
from swarmtune.engine.model.bytes_model import ByteModel
from swarmtune.engine.model.engine_flags import engine_flags
from tests.conftest import run_cli

KV = KVSetting.parse  # a KV setting as a flag spells it


def test_one_spelling_for_both_and_k_first_for_a_pair():
    assert KV("q8_0") == KV("q8_0/q8_0") and KV("q8_0/q8_0").label == str(KV("q8_0")) == "q8_0"
    assert KV("q8_0/f16").label == "q8_0/f16" and KV(" q4_0 / f16 ").label == "q4_0/f16"
    assert KV("q8_0/f16") != KV("f16/q8_0")  # K first
    assert parse_kv_list("f16, q8_0/f16, q8_0/q8_0,q8_0") == (KV("f16"), KV("q8_0/f16"), KV("q8_0"))
    for bad in ("q8_0/", "q8_0/f16/f16", "q9_0/f16", "", " ", None, 8):
        with pytest.raises(UserError):
            KV(bad)  # type: ignore[arg-type]
    with pytest.raises(UserError):
        parse_kv_list(" , ")


def test_the_byte_model_counts_k_and_v_each_at_its_own_type():
    bm = ByteModel.dense(1e9, 1024.0)  # K and V heads alike: half the values each
    q8, f16 = KV_TYPES["q8_0"].bytes_for(1024), KV_TYPES["f16"].bytes_for(1024)
    assert bm.kv_bytes_per_token(KV("q8_0/f16")) == pytest.approx((q8 + f16) / 2)
    assert bm.kv_bytes_per_token(KV("f16/q8_0")) == pytest.approx((q8 + f16) / 2)
    assert bm.kv_bytes_per_token(KV("q8_0/q8_0")) == bm.kv_bytes_per_token(KV("q8_0")) == pytest.approx(q8)
    # K's head three times V's (an MLA-like model): K's type weighs three quarters
    mla = ByteModel(dense_weight_bytes=1e9, kv_values_per_layer=(1024.0,), window_per_layer=(0,), k_share=0.75)
    assert mla.kv_bytes_per_token(KV("q8_0/f16")) == pytest.approx(0.75 * q8 + 0.25 * f16)
    assert ByteModel.from_dict(mla.to_dict()).k_share == 0.75
    assert bm.speedup(8, 2048, KV("q8_0/f16")) > bm.speedup(8, 2048, KV("f16"))  # fewer bytes, larger speedup


def test_a_quantized_type_is_rotated_on_its_own_side_only():
    assert rotation(KV("q8_0"), 64, 64) == (64, 64) and rotation(KV("f16"), 64, 64) == (0, 0)
    assert rotation(KV("q8_0/f16"), 64, 64) == (64, 0) and rotation(KV("f16/q8_0"), 64, 64) == (0, 64)


def test_flags_for_other_engines_say_k_and_v_apart():
    bm = ByteModel.dense(1e9, 1024.0)
    ll, vllm, zinc = engine_flags(4, KV("q8_0/f16"), "keep", 2048, bm, 1e9, None, None)
    i = ll.flags.index("-ctk")
    assert ll.flags[i:i + 4] == ["-ctk", "q8_0", "-ctv", "f16"]
    assert not any("flash attention" in n for n in ll.notes)  # V is f16: no flash attention needed for it
    assert "--kv-cache-dtype" not in vllm.flags and any("K and V" in n for n in vllm.notes)
    assert "--kv-quant" not in zinc.flags
    ll, vllm, _ = engine_flags(4, KV("f16/q8_0"), "keep", 2048, bm, 1e9, None, None)
    assert any("flash attention" in n for n in ll.notes)


def test_a_live_switch_to_a_pair_on_the_simulated_card(sim_engine):
    for _ in range(20):
        sim_engine.step()
    st = sim_engine.request(Control(kv=KV("q8_0/f16")))
    assert st is not None
    r = sim_engine.step()
    assert r.kind == "rebuild" and r.kv_type == "q8_0/f16" == sim_engine.s.kv.label
    for _ in range(5):
        assert sim_engine.step().kv_type == "q8_0/f16"
    with pytest.raises(UserError):
        sim_engine.request(Control.from_http({"kv_type": "q8_0/q9_9"}))
    assert sim_engine.s.kv == KV("q8_0/f16")  # a refused setting changed nothing


def test_the_cli_takes_a_pair_and_refuses_a_bad_one_in_one_line(tmp_path):
    out = tmp_path / "r.jsonl"
    r = run_cli("record", "--sim", "rx9070xt-qwen3.5-9b", "--kv", "q8_0/f16", "-o", str(out), "--steps", "3")
    assert r.returncode == 0, r.stderr
    assert '"kv_type":"q8_0/f16"' in out.read_text().splitlines()[1]
    r = run_cli("record", "--sim", "rx9070xt-qwen3.5-9b", "--kv", "q8_0/zz", "-o", str(out), "--steps", "3")
    assert r.returncode == 2 and "unknown KV type 'zz'" in r.stderr and "Traceback" not in r.stderr

"""The byte model of a GGUF file: which layers slide, which hold experts, which carry recurrent state.

The per-architecture rules follow the llama.cpp that llama-cpp-python 0.3.36 vendors
(src/models/<arch>.cpp load_arch_hparams, src/llama-hparams.cpp), so the facts match what it allocates.
"""

from dataclasses import dataclass
from typing import Any

import numpy as np

from swarmtune.engine.model.bytes_model import ByteModel
from swarmtune.engine.model.gguf_header import GGUFHeader


@dataclass(frozen=True)
class SwaRule:
    pattern: int  # every pattern-th layer is full attention (llama_hparams::set_swa_pattern); 0 = all windowed
    dense_first: bool = False  # the full layer opens each group instead of closing it
    default_window: int = 0  # llama.cpp's value when the GGUF gives none
    when: str = "always"  # always | key (only with a sliding_window > 0) | array (per-layer pattern key only)
    forced_window: int = 0  # llama.cpp overrides the GGUF's window with this (llama4 chunks, smallthinker)


SWA_RULES: dict[str, SwaRule] = {
    "gemma2": SwaRule(2, default_window=4096),
    "gemma3": SwaRule(6, when="key"),
    "gemma3n": SwaRule(5),
    "gemma4": SwaRule(0, when="array"),
    "gpt-oss": SwaRule(2),
    "cohere2": SwaRule(4),
    "cohere2moe": SwaRule(4, dense_first=True),
    "exaone-moe": SwaRule(4, default_window=128),
    "olmo2": SwaRule(4, when="key"),
    "llama4": SwaRule(4, when="llama4", forced_window=8192),  # chunked attention: a chunk at most (modeled as a window)
    "smallthinker": SwaRule(4, dense_first=True, when="key", forced_window=4096),
    "afmoe": SwaRule(4, when="key"),
    "mellum": SwaRule(4, when="key"),
    "plamo3": SwaRule(8, when="key"),
    "muse-glimmer": SwaRule(4),
    "laguna": SwaRule(4, dense_first=True, when="key"),
    "exaone4": SwaRule(4, default_window=4096, when="exaone4"),
    "granite_swa": SwaRule(0, when="array"),
    "step35": SwaRule(0, when="array"),
    "mimo2": SwaRule(0, when="array"),
}

# Recurrent layers: every layer of a pure recurrent model; in a hybrid, the rule named here.
PURE_RECURRENT = {"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"}
RECURRENT_WHERE_NO_KV_HEADS = {"jamba", "granitehybrid", "plamo2", "lfm2", "lfm2moe", "kimi-linear"}
RECURRENT_BY_INTERVAL = {"qwen3next", "qwen35", "qwen35moe"}  # attention every full_attention_interval-th layer
RECURRENT_AND_ATTENTION = {"falcon-h1"}  # every layer has both
NEMOTRON_H = {"nemotron_h", "nemotron_h_moe"}
# looked up one row per token (token_embd only when untied: tied, it is also the output head, read in full)
ROW_READ_TENSORS = ("token_embd.weight", "per_layer_token_embd.weight")
F32_BYTES = 4  # llama.cpp keeps recurrent state in f32 (GGML_TYPE_F32 r and s in llama-model.cpp create_memory)


def _field(reader: GGUFHeader, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def _per_layer(value: Any, n_layer: int, default: int = 0) -> list[int]:
    if value is None:
        return [default] * n_layer
    if isinstance(value, list):
        out = [int(x) for x in value]
        return (out + [out[-1] if out else default] * n_layer)[:n_layer]
    return [int(value)] * n_layer


def _set_swa_pattern(n_layer: int, pattern: int, dense_first: bool) -> list[bool]:
    """llama_hparams::set_swa_pattern."""
    if dense_first:
        return [pattern == 0 or i % pattern != 0 for i in range(n_layer)]
    return [pattern == 0 or i % pattern < pattern - 1 for i in range(n_layer)]


def swa_layers(reader: GGUFHeader, arch: str, n_layer: int, recurrent: list[bool]) -> tuple[list[bool], int]:
    """Which layers slide, and the window, as llama.cpp decides for this architecture."""
    window = int(_field(reader, f"{arch}.attention.sliding_window", 0) or 0)
    pattern_key = _field(reader, f"{arch}.attention.sliding_window_pattern")
    if arch in ("lfm2", "lfm2moe"):  # lfm2.cpp: with a window, every attention layer slides
        return ([not r for r in recurrent], window) if window > 0 else ([False] * n_layer, 0)
    rule = SWA_RULES.get(arch)
    if rule is None:
        return [False] * n_layer, 0
    has_key = f"{arch}.attention.sliding_window" in reader.fields
    on = {
        "always": True,
        "key": window > 0,
        "array": isinstance(pattern_key, list),
        "llama4": not (has_key and window == 0),
        "exaone4": n_layer == 64,
    }[rule.when]
    if not on:
        return [False] * n_layer, 0
    window = rule.forced_window or window or rule.default_window
    if isinstance(pattern_key, list):  # load_swa_pattern: a per-layer array wins
        return [bool(x) for x in _per_layer(pattern_key, n_layer)], window
    pattern = int(pattern_key) if pattern_key is not None else rule.pattern
    return _set_swa_pattern(n_layer, pattern, rule.dense_first), window


def recurrent_layers(reader: GGUFHeader, arch: str, n_layer: int, head_kv: list[int], n_ff: list[int]) -> list[bool]:
    if arch in PURE_RECURRENT or arch in RECURRENT_AND_ATTENTION:
        return [True] * n_layer
    if arch in RECURRENT_WHERE_NO_KV_HEADS:
        return [h == 0 for h in head_kv]
    if arch in NEMOTRON_H:
        return [h == 0 and f == 0 for h, f in zip(head_kv, n_ff, strict=True)]
    if arch in RECURRENT_BY_INTERVAL:
        given = _field(reader, f"{arch}.attention.recurrent_layers")
        if given is not None:
            return [bool(x) for x in _per_layer(given, n_layer)]
        interval = int(_field(reader, f"{arch}.full_attention_interval", 4) or 4)
        return [(i + 1) % interval != 0 for i in range(n_layer)]
    return [False] * n_layer


def attention_layers(arch: str, recurrent: list[bool], head_kv: list[int], n_ff: list[int]) -> list[bool]:
    """Layers with a KV cache (the memory's attention filter in llama_model::create_memory)."""
    if arch in PURE_RECURRENT:
        return [False] * len(recurrent)
    if arch in RECURRENT_AND_ATTENTION:
        return [h > 0 for h in head_kv]
    if arch in NEMOTRON_H:
        return [not r and f == 0 for r, f in zip(recurrent, n_ff, strict=True)]
    return [not r and h > 0 for r, h in zip(recurrent, head_kv, strict=True)]


def state_bytes_per_layer(reader: GGUFHeader, arch: str, n_embd: int, n_head: int) -> int:
    """One sequence's r (conv / token shift) and s (state) rows in one recurrent layer: llama_hparams::n_embd_r/_s."""
    def g(key: str, d: int = 0) -> int:
        return int(_field(reader, f"{arch}.{key}", d) or d)

    wkv = g("wkv.head_size")
    if wkv:  # RWKV
        r, s = g("token_shift_count", 2) * n_embd, n_embd * wkv
    elif g("shortconv.l_cache"):  # LFM2 short convolutions: no state row, only the conv history
        r, s = n_embd * (g("shortconv.l_cache") - 1), 0
    elif g("kda.head_dim"):  # Kimi delta attention
        kda, d_conv = g("kda.head_dim"), g("ssm.conv_kernel")
        r = 3 * (d_conv - 1 if d_conv > 0 else 3) * n_head * kda
        s = kda * kda * n_head
    else:  # Mamba, Mamba-2, gated delta-net (Qwen3-Next): conv_states and ssm_states
        d_conv, d_inner, d_state, n_group = (g("ssm.conv_kernel"), g("ssm.inner_size"), g("ssm.state_size"),
                                             g("ssm.group_count"))
        r = (d_conv - 1 if d_conv > 0 else 0) * (d_inner + 2 * n_group * d_state)
        s = d_state * d_inner
    return (r + s) * F32_BYTES


def _layer_of(name: str) -> int | None:
    if not name.startswith("blk."):
        return None
    try:
        return int(name.split(".")[1])
    except (IndexError, ValueError):
        return None


def bytes_model_from_gguf(reader: GGUFHeader, arch: str, n_layer_all: int, n_embd: int, n_head_per_layer: list[int],
                          head_kv: list[int], source: str) -> ByteModel:
    n_layer = n_layer_all - int(_field(reader, f"{arch}.nextn_predict_layers", 0) or 0)  # MTP heads: not run per step
    head_kv, n_head_per_layer = head_kv[:n_layer], n_head_per_layer[:n_layer]
    n_ff = _per_layer(_field(reader, f"{arch}.feed_forward_length"), n_layer)
    recurrent = recurrent_layers(reader, arch, n_layer, head_kv, n_ff)
    attention = attention_layers(arch, recurrent, head_kv, n_ff)
    sliding, window = swa_layers(reader, arch, n_layer, recurrent)
    n_head0 = n_head_per_layer[0] if n_head_per_layer else 0
    hk = int(_field(reader, f"{arch}.attention.key_length", n_embd // n_head0 if n_head0 else 0))
    hv = int(_field(reader, f"{arch}.attention.value_length", n_embd // n_head0 if n_head0 else 0))
    hk_swa = int(_field(reader, f"{arch}.attention.key_length_swa", hk))
    hv_swa = int(_field(reader, f"{arch}.attention.value_length_swa", hv))
    kv_values, windows = [], []
    for il in range(n_layer):
        if not attention[il]:
            kv_values.append(0.0)
            windows.append(0)
            continue
        swa = sliding[il]
        kv_values.append(float(head_kv[il] * ((hk_swa + hv_swa) if swa else (hk + hv))))
        windows.append(window if swa else 0)

    tensors = list(reader.tensors)
    names = {t.name for t in tensors}
    tied = "output.weight" not in names
    n_expert = int(_field(reader, f"{arch}.expert_count", 0) or 0)
    used = _field(reader, f"{arch}.expert_used_count", 0)
    n_expert_used = int(np.max(used)) if isinstance(used, list) and used else int(used or 0)
    expert_bytes = [0.0] * n_layer
    dense, row = 0.0, 0.0
    for t in tensors:
        nbytes = float(t.n_bytes)
        layer = _layer_of(t.name)
        if layer is not None and layer >= n_layer:
            continue
        if n_expert and layer is not None and "_exps." in t.name:
            expert_bytes[layer] += nbytes / n_expert
        elif t.name in ROW_READ_TENSORS and not (tied and t.name == "token_embd.weight"):
            rows = int(t.shape[-1]) if len(t.shape) else 1
            row += nbytes / max(rows, 1)
        else:
            dense += nbytes
    notes = []
    if arch in ("gemma3n", "gemma4"):
        notes.append("the last layers share earlier layers' KV: the cache holds less than the model counts")
    if arch == "llama4" and any(sliding):
        notes.append("chunked attention counted as a window of one chunk (an upper bound)")
    if arch in ("gemma3n",):
        notes.append("per-layer token embeddings counted as one row per token")
    per_layer_state = state_bytes_per_layer(reader, arch, n_embd, n_head0) if any(recurrent) else 0
    return ByteModel(
        dense_weight_bytes=dense,
        embd_row_bytes=row,
        expert_bytes_per_layer=tuple(expert_bytes) if n_expert and any(expert_bytes) else (),
        n_expert=n_expert if any(expert_bytes) else 0,
        n_expert_used=n_expert_used if any(expert_bytes) else 0,
        kv_values_per_layer=tuple(kv_values),
        window_per_layer=tuple(windows),
        state_bytes=float(per_layer_state * sum(recurrent)),
        k_share=hk / (hk + hv) if hk + hv > 0 else 0.5,
        source=source,
        notes=tuple(notes),
    )

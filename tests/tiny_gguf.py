"""Tiny GGUF models of each architecture family: random weights, a few layers, a byte-level tokenizer.
Enough for llama.cpp to load and decode a sliding-window, mixture-of-experts or recurrent model in a
test, in well under a second each.

The tokenizer is GPT-2's byte-level BPE with no merges (every byte one token) and ChatML's special
tokens: a copy of a real model's 49k-token vocabulary would cost seconds to write and to read back."""

from pathlib import Path

import numpy as np
from gguf import GGUFWriter

N_EMBD = 128
N_HEAD = 4
HEAD_DIM = 32
N_FF = 256
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
VOCAB = len(SPECIAL) + 256


class TinyWriter:
    def __init__(self, path: Path, arch: str, n_layer: int, seed: int = 0) -> None:
        self.path, self.arch = Path(path), arch
        self.w = GGUFWriter(str(path), arch)
        self.rng = np.random.default_rng(seed)
        self.w.add_name(f"tiny-{arch}")
        self.w.add_block_count(n_layer)
        self.w.add_context_length(4096)
        self.w.add_embedding_length(N_EMBD)
        self.w.add_feed_forward_length(N_FF)
        self.w.add_layer_norm_rms_eps(1e-5)
        self.w.add_rope_freq_base(10000.0)
        _add_tokenizer(self.w)

    def attention_shape(self, n_head_kv: int) -> None:
        self.w.add_head_count(N_HEAD)
        self.w.add_head_count_kv(n_head_kv)
        self.w.add_key_length(HEAD_DIM)
        self.w.add_value_length(HEAD_DIM)

    def tensor(self, name: str, *ne: int, scale: float = 0.05, dtype=np.float32) -> None:
        """ne in ggml order (ne0 first), as llama.cpp's create_tensor names them."""
        data = (self.rng.standard_normal(tuple(reversed(ne))) * scale).astype(dtype)
        self.w.add_tensor(name, data)

    def ones(self, name: str, n: int) -> None:
        self.w.add_tensor(name, np.ones(n, dtype=np.float32))

    def embeddings(self, untied: bool) -> None:
        self.tensor("token_embd.weight", N_EMBD, VOCAB, dtype=np.float16)
        if untied:
            self.tensor("output.weight", N_EMBD, VOCAB, dtype=np.float16)

    def attention(self, i: int, n_head_kv: int, norms: bool = True, bias: bool = False) -> None:
        self.tensor(f"blk.{i}.attn_q.weight", N_EMBD, N_HEAD * HEAD_DIM)
        self.tensor(f"blk.{i}.attn_k.weight", N_EMBD, n_head_kv * HEAD_DIM)
        self.tensor(f"blk.{i}.attn_v.weight", N_EMBD, n_head_kv * HEAD_DIM)
        self.tensor(f"blk.{i}.attn_output.weight", N_HEAD * HEAD_DIM, N_EMBD)
        if bias:
            self.tensor(f"blk.{i}.attn_output.bias", N_EMBD)
        if norms:
            self.ones(f"blk.{i}.attn_q_norm.weight", HEAD_DIM)
            self.ones(f"blk.{i}.attn_k_norm.weight", HEAD_DIM)

    def ffn(self, i: int) -> None:
        self.tensor(f"blk.{i}.ffn_gate.weight", N_EMBD, N_FF)
        self.tensor(f"blk.{i}.ffn_up.weight", N_EMBD, N_FF)
        self.tensor(f"blk.{i}.ffn_down.weight", N_FF, N_EMBD)

    def experts(self, i: int, n_expert: int, n_ff_exp: int, bias: bool = False) -> None:
        self.tensor(f"blk.{i}.ffn_gate_inp.weight", N_EMBD, n_expert, scale=0.5)
        self.tensor(f"blk.{i}.ffn_gate_exps.weight", N_EMBD, n_ff_exp, n_expert)
        self.tensor(f"blk.{i}.ffn_up_exps.weight", N_EMBD, n_ff_exp, n_expert)
        self.tensor(f"blk.{i}.ffn_down_exps.weight", n_ff_exp, N_EMBD, n_expert)
        if bias:
            self.tensor(f"blk.{i}.ffn_gate_inp.bias", n_expert)
            self.tensor(f"blk.{i}.ffn_gate_exps.bias", n_ff_exp, n_expert)
            self.tensor(f"blk.{i}.ffn_up_exps.bias", n_ff_exp, n_expert)
            self.tensor(f"blk.{i}.ffn_down_exps.bias", N_EMBD, n_expert)

    def finish(self) -> Path:
        self.w.write_header_to_file()
        self.w.write_kv_data_to_file()
        self.w.write_tensors_to_file()
        self.w.close()
        return self.path


def _byte_tokens() -> list[str]:
    """GPT-2's bytes_to_unicode: the printable stand-in for each byte, in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return [out[b] for b in range(256)]


def _add_tokenizer(w: GGUFWriter, n_vocab: int = VOCAB) -> None:
    """n_vocab: past the byte tokens, unused ones (type 5) that no text tokenizes to but every logits row
    and every sampler still carries: a large vocabulary's host cost without its tokenizer."""
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")  # the default model's pre-tokenizer
    pad = max(0, n_vocab - VOCAB)
    w.add_token_list([*SPECIAL, *_byte_tokens(), *(f"<unused_{i}>" for i in range(pad))])
    w.add_token_types([3] * len(SPECIAL) + [1] * 256 + [5] * pad)  # 3 control, 1 normal, 5 unused
    w.add_token_merges(["Ġ Ġ"])  # llama.cpp wants the key; one merge whose result it never finds is harmless
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)


def gemma3_swa(path: Path, window: int = 64) -> Path:
    """Gemma 3: five sliding-window layers, then one global (llama.cpp's default pattern of 6)."""
    t = TinyWriter(path, "gemma3", 6)
    t.attention_shape(N_HEAD)
    t.w.add_sliding_window(window)
    t.embeddings(untied=False)
    t.ones("output_norm.weight", N_EMBD)
    for i in range(6):
        t.ones(f"blk.{i}.attn_norm.weight", N_EMBD)
        t.attention(i, N_HEAD)
        t.ones(f"blk.{i}.post_attention_norm.weight", N_EMBD)
        t.ones(f"blk.{i}.ffn_norm.weight", N_EMBD)
        t.ffn(i)
        t.ones(f"blk.{i}.post_ffw_norm.weight", N_EMBD)
    return t.finish()


def qwen3moe(path: Path, n_expert: int = 8, n_used: int = 2, n_layer: int = 4, n_ff_exp: int = 64,
             n_embd_scale: float = 0.05) -> Path:
    t = TinyWriter(path, "qwen3moe", n_layer)
    t.attention_shape(2)
    t.w.add_expert_count(n_expert)
    t.w.add_expert_used_count(n_used)
    t.w.add_expert_feed_forward_length(n_ff_exp)
    t.embeddings(untied=False)
    t.ones("output_norm.weight", N_EMBD)
    for i in range(n_layer):
        t.ones(f"blk.{i}.attn_norm.weight", N_EMBD)
        t.attention(i, 2)
        t.ones(f"blk.{i}.ffn_norm.weight", N_EMBD)
        t.experts(i, n_expert, n_ff_exp)
    return t.finish()


def gpt_oss(path: Path, window: int = 64) -> Path:
    """gpt-oss: experts in every layer, sliding window on the even layers, an untied output head."""
    n_layer, n_expert = 4, 8
    t = TinyWriter(path, "gpt-oss", n_layer)
    t.attention_shape(2)
    t.w.add_expert_count(n_expert)
    t.w.add_expert_used_count(2)
    t.w.add_expert_feed_forward_length(64)
    t.w.add_sliding_window(window)
    t.embeddings(untied=True)
    t.ones("output_norm.weight", N_EMBD)
    for i in range(n_layer):
        t.ones(f"blk.{i}.attn_norm.weight", N_EMBD)
        t.ones(f"blk.{i}.post_attention_norm.weight", N_EMBD)
        t.attention(i, 2, norms=False, bias=True)
        t.tensor(f"blk.{i}.attn_sinks.weight", N_HEAD)
        t.experts(i, n_expert, 64, bias=True)
    return t.finish()


def mamba(path: Path, n_layer: int = 4, d_state: int = 64, d_conv: int = 4, dt_rank: int = 8) -> Path:
    """Mamba: no attention, a fixed conv + SSM state per sequence in every layer."""
    d_inner = 2 * N_EMBD  # llama.cpp supports an expansion factor of 2 only
    t = TinyWriter(path, "mamba", n_layer)
    t.w.add_head_count(0)
    t.w.add_head_count_kv(0)
    t.w.add_ssm_conv_kernel(d_conv)
    t.w.add_ssm_inner_size(d_inner)
    t.w.add_ssm_state_size(d_state)
    t.w.add_ssm_time_step_rank(dt_rank)
    t.embeddings(untied=False)
    t.ones("output_norm.weight", N_EMBD)
    for i in range(n_layer):
        t.ones(f"blk.{i}.attn_norm.weight", N_EMBD)
        t.tensor(f"blk.{i}.ssm_in.weight", N_EMBD, 2 * d_inner)
        t.tensor(f"blk.{i}.ssm_conv1d.weight", d_conv, d_inner)
        t.tensor(f"blk.{i}.ssm_conv1d.bias", d_inner)
        t.tensor(f"blk.{i}.ssm_x.weight", d_inner, dt_rank + 2 * d_state)
        t.tensor(f"blk.{i}.ssm_dt.weight", dt_rank, d_inner)
        t.tensor(f"blk.{i}.ssm_dt.bias", d_inner)
        t.w.add_tensor(f"blk.{i}.ssm_a", -np.exp(t.rng.standard_normal((d_inner, d_state))).astype(np.float32))
        t.ones(f"blk.{i}.ssm_d", d_inner)
        t.tensor(f"blk.{i}.ssm_out.weight", d_inner, N_EMBD)
    return t.finish()


LFM2_ATTENTION_LAYERS = (2, 5)


def lfm2(path: Path, n_layer: int = 6, l_cache: int = 17) -> Path:
    """LFM2: short-convolution layers (a fixed conv history per sequence) with a few attention layers."""
    t = TinyWriter(path, "lfm2", n_layer)
    head_kv = [2 if i in LFM2_ATTENTION_LAYERS else 0 for i in range(n_layer)]
    t.w.add_head_count(N_HEAD)
    t.w.add_head_count_kv(head_kv)
    t.w.add_shortconv_l_cache(l_cache)
    t.embeddings(untied=False)
    t.ones("token_embd_norm.weight", N_EMBD)
    for i in range(n_layer):
        t.ones(f"blk.{i}.ffn_norm.weight", N_EMBD)
        t.ffn(i)
        t.ones(f"blk.{i}.attn_norm.weight", N_EMBD)
        if head_kv[i]:
            t.attention(i, head_kv[i])
        else:
            t.tensor(f"blk.{i}.shortconv.conv.weight", l_cache, N_EMBD)
            t.tensor(f"blk.{i}.shortconv.in_proj.weight", N_EMBD, 3 * N_EMBD)
            t.tensor(f"blk.{i}.shortconv.out_proj.weight", N_EMBD, N_EMBD)
    return t.finish()


def llama_dense(path: Path, chat_template: str, n_layer: int = 2) -> Path:
    """A dense Llama-architecture model carrying a family's chat template (tokenizer.chat_template)."""
    t = TinyWriter(path, "llama", n_layer)
    t.attention_shape(N_HEAD)
    t.w.add_chat_template(chat_template)
    t.w.add_rope_dimension_count(HEAD_DIM)
    t.embeddings(untied=False)
    t.ones("output_norm.weight", N_EMBD)
    for i in range(n_layer):
        t.ones(f"blk.{i}.attn_norm.weight", N_EMBD)
        t.attention(i, N_HEAD, norms=False)
        t.ones(f"blk.{i}.ffn_norm.weight", N_EMBD)
        t.ffn(i)
    return t.finish()


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def llama_device(path: Path, n_layer: int = 2, seed: int = 0, n_vocab: int = VOCAB) -> Path:
    """A dense Llama for the device lane, fast enough for a software device: head size 64 (every device
    backend's flash attention has a kernel for it; Vulkan has none for the others' 32), grouped-query
    attention (2 KV heads for 4), f16 matrices, a ChatML template. The attention weights are scaled so
    that the next token depends strongly on the context: a cache holding the wrong cells moves the
    next-token distribution by nats, not by rounding."""
    n_embd, n_head, n_head_kv, head_dim, n_ff = 256, 4, 2, 64, 512
    w = GGUFWriter(str(path), "llama")
    rng = np.random.default_rng(seed)

    def tensor(name: str, *ne: int, scale: float) -> None:
        w.add_tensor(name, (rng.standard_normal(tuple(reversed(ne))) * scale).astype(np.float16))

    w.add_name("tiny-llama-device")
    w.add_block_count(n_layer)
    w.add_context_length(4096)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(head_dim)
    w.add_chat_template(CHATML)
    _add_tokenizer(w, n_vocab)
    tensor("token_embd.weight", n_embd, max(n_vocab, VOCAB), scale=0.3)  # tied: the output head too
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        tensor(f"blk.{i}.attn_q.weight", n_embd, n_head * head_dim, scale=0.1)
        tensor(f"blk.{i}.attn_k.weight", n_embd, n_head_kv * head_dim, scale=0.1)
        tensor(f"blk.{i}.attn_v.weight", n_embd, n_head_kv * head_dim, scale=0.1)
        tensor(f"blk.{i}.attn_output.weight", n_head * head_dim, n_embd, scale=0.1)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        tensor(f"blk.{i}.ffn_gate.weight", n_embd, n_ff, scale=0.05)
        tensor(f"blk.{i}.ffn_up.weight", n_embd, n_ff, scale=0.05)
        tensor(f"blk.{i}.ffn_down.weight", n_ff, n_embd, scale=0.05)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path

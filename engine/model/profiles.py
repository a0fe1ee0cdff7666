"""Named hardware profiles for the sim backend: what-if on hardware you do not have.

Each profile says where its numbers come from. A profile's step time is the roofline model
t = (W(B) + sum over the batch of (s + K(L))) / bandwidth + B * compute_seconds_per_token (engine/model/bytes_model.py;
W(B) = W and K(L) = L k for a dense model), its power floor + per-agent watts.
"""

import functools
from dataclasses import dataclass, replace
from typing import Any

from swarmtune.engine.errors import UserError
from swarmtune.engine.kv.types import F16
from swarmtune.engine.model.bytes_model import ByteModel


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    model_name: str
    weight_bytes: float
    kv_bytes_per_token_f16: float
    effective_bandwidth_bytes_per_s: float
    compute_seconds_per_token: float  # per sequence in the batch; 0 = purely memory-bound
    prefill_tokens_per_s: float
    kv_budget_bytes: float  # what the device can hold of KV for the whole swarm
    context_per_agent: int  # default context limit per agent, tokens
    n_ctx_train: int
    power_floor_watts: float
    power_per_agent_watts: float
    source: str  # where the numbers come from
    # what a step reads, layer by layer; None: dense, from weight_bytes and kv_bytes_per_token_f16
    layers: ByteModel | None = None
    # device <-> host copies of a swapped-out history (modeled): PCIe 4.0 x16's 32 GB/s at ~80% efficiency
    host_link_bytes_per_s: float = 25e9
    device_memory_bytes: float | None = None  # the card's memory (vLLM's --gpu-memory-utilization is a share of it)
    # per KV type, what reading one of its cache bytes costs against a weight byte (a dequantizing kernel
    # slower or faster than the byte count says); a type not named costs 1. A card's truth that a stated
    # profile may not know: the bench's mis-stated cards (bench/autotune.py)
    kv_cost_factor: tuple[tuple[str, float], ...] = ()

    @functools.cached_property  # read on every simulated step: one model, with its per-type terms cached
    def bytes_model(self) -> ByteModel:
        if self.layers is not None:
            return self.layers
        return ByteModel.dense(self.weight_bytes, self.kv_bytes_per_token_f16 / 2,
                               source=f"profile {self.name}: {self.source}")


def _anchor_bandwidth(weight_bytes: float, k: float, context: int, tokens_per_s: float) -> float:
    """The bandwidth that makes a batch-1 step at `context` run at the measured `tokens_per_s`."""
    return (weight_bytes + context * k) * tokens_per_s


_QWEN_W, _QWEN_K = 5.5e9, 147e3
_SEED_BANDWIDTH = (_QWEN_W + 2400 * _QWEN_K) * 39.6  # the RX 9070 XT's effective bytes/s in the seed's measurement


def gpt_oss_20b() -> ByteModel:
    """gpt-oss-20b from its published config (openai/gpt-oss-20b config.json): 24 layers, hidden 2880, 32 experts
    of which 4 per token with an expert FFN of 2880, 64 query heads and 8 KV heads of 64, attention biases and
    sinks, a 128-token window on the even layers (llama.cpp: gpt-oss pattern 2), vocabulary 201,088, untied head.
    Precision as published: experts MXFP4 (4.25 bits a weight with their block scales), everything else bf16."""
    n_layer, d, n_expert, n_used, ff = 24, 2880, 32, 4, 2880
    q, kv_heads, hd, vocab = 64, 8, 64, 201_088
    bf16, mxfp4 = 2.0, 4.25 / 8
    attention = (d * q * hd + q * hd) + 2 * (d * kv_heads * hd + kv_heads * hd) + (q * hd * d + d) + q + 2 * d
    router = d * n_expert + n_expert
    expert = 3 * d * ff * mxfp4 + (2 * ff + d) * bf16  # gate+up and down matrices, their biases
    dense = n_layer * (attention + router) * bf16 + vocab * d * bf16 + d * bf16  # layers, output head, final norm
    return ByteModel(
        dense_weight_bytes=dense,
        embd_row_bytes=d * bf16,
        expert_bytes_per_layer=(expert,) * n_layer,
        n_expert=n_expert,
        n_expert_used=n_used,
        kv_values_per_layer=(2.0 * kv_heads * hd,) * n_layer,
        window_per_layer=tuple(128 if i % 2 == 0 else 0 for i in range(n_layer)),
        source="gpt-oss-20b's published config and checkpoint precision (estimated; routing modeled)",
    )


_GPT_OSS = gpt_oss_20b()
_GPT_OSS_FILE = _GPT_OSS.all_weight_bytes + 201_088 * 2880 * 2.0  # plus the token embedding table
PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            name="rx9070xt-qwen3.5-9b",
            device_memory_bytes=16e9,
            description="RX 9070 XT (16 GB, 640 GB/s), Qwen3.5-9B Q4_K_M: the seed documents' numbers",
            model_name="Qwen3.5-9B Q4_K_M (simulated)",
            weight_bytes=_QWEN_W,
            kv_bytes_per_token_f16=_QWEN_K,
            # 39.6 tok/s for one agent at 2,400 tokens (seed, measured there) sets the effective bandwidth
            effective_bandwidth_bytes_per_s=_anchor_bandwidth(_QWEN_W, _QWEN_K, 2400, 39.6),
            compute_seconds_per_token=0.0,
            prefill_tokens_per_s=962.0,
            kv_budget_bytes=55_000 * _QWEN_K,  # the seed's "card KV budget" of 55,000 fp16 tokens
            context_per_agent=16384,
            n_ctx_train=262144,
            power_floor_watts=130.0,
            power_per_agent_watts=10.0,
            source="seed documents: W 5.5 GB, k 147 KB, 39.6 tok/s at 2,400 tokens, 130 W + 10 W per agent (modeled)",
        ),
        Profile(
            name="rx9070xt-gpt-oss-20b",
            device_memory_bytes=16e9,
            description="RX 9070 XT (16 GB), gpt-oss-20b (MoE 32 experts top-4, 128-token window on half the "
                        "layers): simulated from the model's published config",
            model_name="gpt-oss-20b MXFP4 (simulated)",
            weight_bytes=_GPT_OSS.weight_bytes(1) - _GPT_OSS.embd_row_bytes,
            kv_bytes_per_token_f16=_GPT_OSS.kv_bytes_per_token(F16),
            effective_bandwidth_bytes_per_s=_SEED_BANDWIDTH,
            compute_seconds_per_token=0.0,
            prefill_tokens_per_s=962.0 * 9.0 / 3.6,  # the seed's 9B prefill rate scaled by active parameters
            kv_budget_bytes=16e9 - _GPT_OSS_FILE - 1.0e9,  # the card less the weights and ~1 GB of buffers
            context_per_agent=16384,
            n_ctx_train=131072,
            power_floor_watts=130.0,
            power_per_agent_watts=10.0,
            source="gpt-oss-20b config (24 layers, 32 experts top-4, window 128 on even layers) and published "
            "precision, estimated; the seed card's effective bandwidth and power model assumed (modeled)",
            layers=_GPT_OSS,
        ),
        Profile(
            name="rtx4090-qwen3.5-9b",
            device_memory_bytes=24e9,
            description="RTX 4090 (24 GB, 1008 GB/s spec), Qwen3.5-9B Q4_K_M, the RX 9070 XT's efficiency assumed",
            model_name="Qwen3.5-9B Q4_K_M (simulated)",
            weight_bytes=_QWEN_W,
            kv_bytes_per_token_f16=_QWEN_K,
            effective_bandwidth_bytes_per_s=_anchor_bandwidth(_QWEN_W, _QWEN_K, 2400, 39.6) * 1008 / 640,
            compute_seconds_per_token=0.0,
            prefill_tokens_per_s=962.0 * 82.6 / 48.7,  # FP16 tensor TFLOPs ratio of the two cards
            kv_budget_bytes=(24e9 - _QWEN_W - 1.5e9),
            context_per_agent=16384,
            n_ctx_train=262144,
            power_floor_watts=150.0,
            power_per_agent_watts=14.0,
            source="spec-sheet bandwidth scaled from the RX 9070 XT anchor; power a guess from board power (modeled)",
        ),
        Profile(
            name="cpu2-smollm2-135m",
            description="a 2-core AMX CPU, SmolLM2-135M Q4_1: fitted to this project's own CPU measurements",
            model_name="SmolLM2-135M-Instruct Q4_1 (simulated)",
            weight_bytes=96_576_768,
            kv_bytes_per_token_f16=23_040,
            effective_bandwidth_bytes_per_s=37e9,
            compute_seconds_per_token=3.3e-3,
            prefill_tokens_per_s=1500.0,
            kv_budget_bytes=8 * 4096 * 23_040,
            context_per_agent=2048,
            n_ctx_train=8192,
            power_floor_watts=25.0,
            power_per_agent_watts=3.0,
            source="fit to llama.cpp decode timings on a 2-core CPU (64 tokens: 170 tok/s at batch 1, "
            "273 at batch 8); power guessed (modeled)",
        ),
    )
}


def profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise UserError(f"unknown profile {name!r}; 'swarmtune profiles' lists them: {', '.join(PROFILES)}") from None


def misstated(p: Profile, true: dict[str, Any]) -> Profile:
    """The card as it is where its profile p (what a tuner forecasts with) mis-states it: `true` scales its
    bandwidth and compute (`{"bandwidth": 0.7}`: 30% below p) and sets what reading a KV type's bytes costs
    (`{"kv_cost": {"q8_0": 2.5}}`). The bench's and the tests' mis-stated cards (simulated)."""
    return replace(p, name=p.name + " (as it is)",
                   effective_bandwidth_bytes_per_s=p.effective_bandwidth_bytes_per_s * true.get("bandwidth", 1.0),
                   compute_seconds_per_token=p.compute_seconds_per_token * true.get("compute", 1.0),
                   kv_cost_factor=tuple(true.get("kv_cost", {}).items()))

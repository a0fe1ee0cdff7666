"""The figure of the README's "Beyond dense models" section: what sliding windows, experts and recurrent
state do to the 8-agent speedup curve, beside the dense one. Every curve is modeled (engine/model/bytes_model.py).

    python screenshots/make_arch_curves.py

Writes screenshots/arch_curves.png.
"""

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from swarmtune.engine.measure.speedup import predicted_speedup  # noqa: E402
from swarmtune.engine.model.bytes_model import ByteModel  # noqa: E402
from swarmtune.engine.model.profiles import profile  # noqa: E402

HERE = Path(__file__).resolve().parent
B = 8
KV = "f16"
N_LAYER = 32


def seed_variants() -> dict[str, ByteModel]:
    """The seed's dense model (W 5.5 GB, k 147 KB per f16 token, 32 layers), and the same bytes rearranged."""
    w, k = 5.5e9, 147e3
    per_layer = k / 2 / N_LAYER  # f16 values per token per layer
    dense = ByteModel(dense_weight_bytes=w, kv_values_per_layer=(per_layer,) * N_LAYER, window_per_layer=(0,) * N_LAYER)
    swa = ByteModel(dense_weight_bytes=w, kv_values_per_layer=dense.kv_values_per_layer,
                    window_per_layer=tuple(1024 if i % 6 < 5 else 0 for i in range(N_LAYER)))  # Gemma 3's 5:1
    experts_total = 0.8 * w  # 80% of the same file in 32 experts a layer, 4 per token
    moe = ByteModel(dense_weight_bytes=w - experts_total,
                    expert_bytes_per_layer=(experts_total / 32 / N_LAYER,) * N_LAYER, n_expert=32, n_expert_used=4,
                    kv_values_per_layer=dense.kv_values_per_layer, window_per_layer=dense.window_per_layer)
    # Qwen3-Next / Qwen3.5 style: three layers in four gated delta-net (no KV, a fixed state), the fourth attention
    state_per_layer = ((4 - 1) * 8192 + 128 * 4096) * 4  # conv + state rows, f32 (llama_hparams::n_embd_r/_s)
    hybrid = ByteModel(dense_weight_bytes=w,
                       kv_values_per_layer=tuple(per_layer if i % 4 == 3 else 0.0 for i in range(N_LAYER)),
                       window_per_layer=dense.window_per_layer, state_bytes=state_per_layer * N_LAYER * 3 / 4)
    return {
        "dense (the seed: W 5.5 GB, k 147 KB)": dense,
        "sliding window: 5 layers in 6 read at most 1,024 tokens": swa,
        "experts: 80% of the weights in 32 experts, 4 per token": moe,
        "recurrent: 3 layers in 4 keep a 2.2 MB state, not KV": hybrid,
    }


def main() -> None:
    xs = [10 ** (2 + 3.1 * i / 200) for i in range(201)]  # 100 .. ~126k tokens
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8), dpi=110, sharey=True)
    for (label, bm), style in zip(seed_variants().items(), ("k-", "C0--", "C3-.", "C2:"), strict=True):
        left.plot(xs, [bm.speedup(B, x, KV) for x in xs], style, lw=2 if label.startswith("dense") else 1.6,
                  label=label)
    left.set_title("the seed's bytes, rearranged (modeled)")

    bm = profile("rx9070xt-gpt-oss-20b").bytes_model
    w_all = bm.all_weight_bytes + bm.embd_row_bytes
    k_all = bm.kv_bytes_per_token(KV)
    right.plot(xs, [bm.speedup(B, x, KV) for x in xs], "C3-", lw=2, label="bytes model: 32 experts top-4, window 128 "
               "on half the layers")
    right.plot(xs, [predicted_speedup(B, x, w_all, k_all) for x in xs], "k--", lw=1.4,
               label=f"dense formula: W = all {w_all / 1e9:.1f} GB, k = {k_all / 1e3:.0f} KB")
    no_windows = ByteModel.from_dict({**bm.to_dict(), "window_per_layer": [0] * len(bm.window_per_layer)})
    right.plot(xs, [no_windows.speedup(B, x, KV) for x in xs], "C0:", lw=1.4, label="experts only (windows off)")
    cross = bm.crossover_context(B, KV)
    if math.isfinite(cross):
        right.axvline(cross, color="grey", lw=0.8)
        right.annotate(f"L* = {cross:,.0f}", (cross, 7.4), fontsize=8, ha="right", color="grey")
    right.set_title("gpt-oss-20b, from its published config (modeled)")

    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_xlabel("context per agent (tokens)")
        ax.set_ylim(0, B + 0.3)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7.5, loc="lower left")
    left.set_ylabel(f"{B}-agent speedup vs batch 1")
    fig.suptitle(f"Batching {B} agents: S = B(W(1) + s + K(L)) / (W(B) + B(s + K(L))), f16 KV; all curves modeled",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(HERE / "arch_curves.png")
    plt.close(fig)
    print(f"wrote {HERE / 'arch_curves.png'}")


if __name__ == "__main__":
    main()

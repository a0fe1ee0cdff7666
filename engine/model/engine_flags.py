"""A setting the tuner found, said as the flags of the engines people run: llama-server, vLLM, ZINC.

Only what maps is printed; what has no counterpart says so, rather than a near-miss flag that would
change something else."""

import json
from dataclasses import dataclass
from typing import Any

from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.model.bytes_model import ByteModel

# llama.cpp cache type -> vLLM's --kv-cache-dtype: vLLM quantizes KV to 8-bit float only
VLLM_KV = {"f16": "auto", "bf16": "auto", "f32": "auto", "q8_0": "fp8"}
# llama.cpp cache type -> ZINC's --kv-quant
ZINC_KV = {"f16": "f16", "q8_0": "q8", "q4_0": "q4"}


@dataclass(frozen=True)
class EngineFlags:
    engine: str
    flags: list[str]
    notes: list[str]

    def as_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "flags": self.flags, "command": " ".join(self.flags), "notes": self.notes}


def engine_flags(batch_cap: int, kv: KVSetting, residency: str, ctx_per_agent: int, bm: ByteModel,
                 weight_bytes: float, kv_budget_bytes: float | None, device_bytes: float | None,
                 draft_tokens: int = 0, draft_auto: bool = False, draft_model: str | None = None,
                 draft_p_min: float = 0.0) -> list[EngineFlags]:
    """draft_tokens: speculation from the agents' own text (engine/spec/), up to that many a step; draft_auto:
    each agent's length measured, up to it; draft_model: drafts from that model instead, each stopped below
    draft_p_min."""
    out = []
    notes = []
    # llama-server splits -c cells evenly over its -np slots: as many as the budget holds at this type
    cells = batch_cap * ctx_per_agent
    if kv_budget_bytes:
        cells = min(cells, bm.budget_tokens(kv_budget_bytes, kv, batch_cap, ctx_per_agent))
        if cells < batch_cap * ctx_per_agent:
            notes.append(f"-c {cells}: what the KV budget holds at {kv}; each slot gets {cells // batch_cap} tokens")
    ll = ["-np", str(batch_cap), "-ctk", kv.k.name, "-ctv", kv.v.name, "-c", str(cells)]
    if kv.v.quantized:
        notes.append("a quantized V cache needs flash attention: add -fa on where your build does not default to it")
    if bm.has_swa:
        notes.append("windowed layers: leave --swa-full off (the default) so each slot keeps only its window")
    if residency == "swap":
        ll += ["--slot-save-path", "SLOTS_DIR"]
        notes.append("swap: an idle agent's slot saved and restored through POST /slots/{id}?action=save|restore")
    elif residency == "drop":
        notes.append("drop: no flag; an idle agent's slot is simply reused, and its prompt re-processed on return")
    if draft_tokens and draft_model:  # flag names read from the pinned llama.cpp's common/arg.cpp
        ll += ["--spec-draft-model", draft_model, "--spec-draft-n-max", str(draft_tokens), "--spec-draft-p-min",
               str(draft_p_min)]
        if draft_auto:
            notes.append("speculation: llama-server has no per-slot measured length (auto): the most is set")
    elif draft_tokens:
        # its n-gram lookup over the slot's own text, 3 tokens long as swarmtune's first try (which then tries 2,
        # and the other agents' text: llama-server's ngram-cache keeps such a pool, from a file)
        ll += ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3",
               "--spec-ngram-simple-size-m", str(draft_tokens)]
        notes.append("speculation: llama-server looks up only the slot's own text, not the other slots'"
                     + ("; it has no per-slot measured length (auto): the most is set" if draft_auto else ""))
    out.append(EngineFlags("llama-server", ["llama-server", *ll], notes))

    v = ["vllm", "serve", "MODEL", "--max-num-seqs", str(batch_cap), "--max-model-len", str(ctx_per_agent)]
    vnotes = []
    if kv.k == kv.v and kv.label in VLLM_KV:
        v += ["--kv-cache-dtype", VLLM_KV[kv.label]]
    elif kv.k != kv.v:
        vnotes.append(f"KV {kv}: vLLM sets one type for K and V (--kv-cache-dtype); no flag for them apart")
    else:
        vnotes.append(f"KV {kv}: vLLM has no such cache type (fp8 is its only quantized KV)")
    if device_bytes and kv_budget_bytes:
        util = min(0.98, (weight_bytes + kv_budget_bytes) / device_bytes)
        v += ["--gpu-memory-utilization", f"{util:.2f}"]
    else:
        vnotes.append("--gpu-memory-utilization: the device's memory is unknown here")
    if residency == "swap":
        vnotes.append("swap: vLLM swaps or recomputes preempted requests itself (--swap-space where the version "
                      "has it)")
    if draft_tokens and draft_model:
        v += ["--speculative-config", json.dumps({"model": draft_model, "num_speculative_tokens": draft_tokens})]
    elif draft_tokens:  # vLLM's prompt lookup: n-grams of 3 down to 2 tokens in the request's own text
        v += ["--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": draft_tokens,
                                                  "prompt_lookup_max": 3, "prompt_lookup_min": 2})]
        vnotes.append("speculation: vLLM's ngram looks up the request's own text only; one length for all")
    out.append(EngineFlags("vLLM", v, vnotes))

    z = ["zinc", "--parallel", str(batch_cap)]
    znotes = ["ZINC's flag names as its README gives them; its --kv-quant values not checked against a build here"]
    if kv.k == kv.v and kv.label in ZINC_KV:
        z += ["--kv-quant", ZINC_KV[kv.label]]
    else:
        znotes.append(f"KV {kv}: no ZINC --kv-quant equivalent")
    if draft_tokens:
        znotes.append("speculation: no ZINC flag known for it")
    out.append(EngineFlags("ZINC", z, znotes))
    return out

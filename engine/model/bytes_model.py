"""What one decode step reads, for dense, sliding-window, mixture-of-experts and recurrent models.

A decode step of B agents, each at context L, reads
  W(B)  the weights: the always-read part, plus the experts the B tokens route to (MoE layers), plus one
        row of an untied token embedding per token;
  B s   each agent's recurrent state (Mamba, RWKV, short convolutions, gated delta-net layers), whatever L;
  B K(L) each agent's KV: the sum over attention layers of bytes per token x min(L, window), window 0 = all.
so the batching speedup over batch 1 at the same context is
  S(B, L) = B (W(1) + s + K(L)) / (W(B) + B (s + K(L))),
which is the seed's B(W + Lk)/(W + BLk) for a dense, full-attention model with a tied embedding.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from swarmtune.engine.kv.types import KV_TYPES, UNKNOWN_KV, KVSetting, read_kv

ROUTING_MODELED = "modeled: uniform routing, E(1 - (1 - k/E)^B) distinct experts per layer"
SWA_CELL_PAD = 256  # llama.cpp pads each SWA stream to a multiple of 256 cells (llama-kv-cache-iswa.cpp)


def _pad(n: int, to: int) -> int:
    return (n + to - 1) // to * to


@dataclass(frozen=True)
class StepRead:
    """The bytes of one step, term by term: K(L_i) per agent, s, W(1), W(B) for the batch's agents, and the
    weights the step as run read (a prefill carries more tokens than agents)."""

    kv_per_agent: list[float]
    state_bytes: float
    weight_one: float
    weight_batch: float
    weight_step: float

    @property
    def kv_bytes(self) -> float:
        return sum(self.kv_per_agent)

    @property
    def speedup(self) -> float:
        """The batch's throughput over the mean batch-1 throughput at the same contexts (bandwidth only)."""
        b = len(self.kv_per_agent)
        if b == 0:
            return 0.0
        one = sum(self.weight_one + self.state_bytes + k for k in self.kv_per_agent) / b
        many = self.weight_batch + b * self.state_bytes + self.kv_bytes
        return b * one / many if many > 0 else float(b)


@dataclass(frozen=True)
class ByteModel:
    dense_weight_bytes: float  # read by every step whatever the batch: attention, norms, routers, shared experts, head
    embd_row_bytes: float = 0.0  # one row of an untied token_embd, read once per token in the batch
    expert_bytes_per_layer: tuple[float, ...] = ()  # one expert's bytes in each layer (0 for a layer without experts)
    n_expert: int = 0  # E; 0 for a dense model
    n_expert_used: int = 0  # k: experts each token routes to
    kv_values_per_layer: tuple[float, ...] = ()  # K and V elements one token adds to each layer's cache (0: no KV)
    window_per_layer: tuple[int, ...] = ()  # tokens each layer attends to; 0 = the whole context
    state_bytes: float = 0.0  # s: one agent's recurrent state, f32 conv (r) and state (s) rows over recurrent layers
    # K's share of kv_values_per_layer (its head size over K's and V's): what a K/V setting ("q8_0/f16")
    # stores at each type; a half where the two heads are alike, as in most models
    k_share: float = 0.5
    source: str = ""  # where the numbers came from
    notes: tuple[str, ...] = field(default_factory=tuple)  # what the model leaves out for this architecture
    # per KV type: (bytes per token of the full-attention layers, (bytes, window) of each windowed layer).
    # K(L) is asked for on every step and at every point of a curve; summing layer by layer each time
    # cost the dashboard tens of ms a frame.
    _kv_terms_cache: dict[KVSetting, tuple[float, tuple[tuple[float, int], ...]]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.window_per_layer) != len(self.kv_values_per_layer):
            raise ValueError("window_per_layer and kv_values_per_layer must have one entry per layer")
        if self.n_expert and not 0 < self.n_expert_used <= self.n_expert:
            raise ValueError(f"expert_used_count {self.n_expert_used} does not fit expert_count {self.n_expert}")

    @classmethod
    def dense(cls, weight_bytes: float, kv_values_per_token: float, embd_row_bytes: float = 0.0,
              source: str = "") -> "ByteModel":
        """The seed's model: one shared weight stream, one KV cost per token (all of it in one full-attention layer)."""
        return cls(dense_weight_bytes=weight_bytes, embd_row_bytes=embd_row_bytes,
                   kv_values_per_layer=(kv_values_per_token,), window_per_layer=(0,), source=source)

    # what kind of model this is
    @property
    def is_moe(self) -> bool:
        return self.n_expert > 0 and any(self.expert_bytes_per_layer)

    @property
    def has_swa(self) -> bool:
        return any(w > 0 and v > 0 for w, v in zip(self.window_per_layer, self.kv_values_per_layer, strict=True))

    @property
    def is_dense(self) -> bool:
        return not self.is_moe and not self.has_swa and self.state_bytes == 0

    @property
    def kind(self) -> str:
        parts = [p for p, on in (("MoE", self.is_moe), ("sliding window", self.has_swa),
                                 ("recurrent state", self.state_bytes > 0)) if on]
        return " + ".join(parts) or "dense"

    # weights
    def expected_distinct_experts(self, tokens: int) -> float:
        """Distinct experts per layer that `tokens` independently, uniformly routed tokens touch (modeled)."""
        if not self.n_expert or tokens <= 0:
            return 0.0
        e, k = self.n_expert, self.n_expert_used
        return e * (1.0 - (1.0 - k / e) ** tokens)

    def weight_bytes(self, batch: int, distinct_experts: float | Sequence[float] | None = None) -> float:
        """W(B): weight bytes a step carrying `batch` tokens reads.

        distinct_experts: measured distinct experts, one mean over MoE layers or one per layer;
        None models uniform routing.
        """
        w = self.dense_weight_bytes + batch * self.embd_row_bytes
        if not self.is_moe or batch <= 0:
            return w
        if distinct_experts is None:
            d = self.expected_distinct_experts(batch)
            return w + d * sum(self.expert_bytes_per_layer)
        if isinstance(distinct_experts, (int, float)):
            return w + float(distinct_experts) * sum(self.expert_bytes_per_layer)
        moe = [b for b in self.expert_bytes_per_layer if b > 0]
        if len(moe) != len(distinct_experts):
            raise ValueError(f"{len(distinct_experts)} distinct-expert counts for {len(moe)} MoE layers")
        return w + sum(b * d for b, d in zip(moe, distinct_experts, strict=True))

    @property
    def all_weight_bytes(self) -> float:
        """Every expert of every layer, the embedding left out: what a step reads once the batch touches all experts."""
        return self.dense_weight_bytes + self.n_expert * sum(self.expert_bytes_per_layer)

    # KV
    def _layer_bytes(self, kv: KVSetting) -> list[float]:
        return [kv.bytes_for(v, self.k_share) for v in self.kv_values_per_layer]

    def kv_bytes_per_token(self, kv: KVSetting, windowed: bool | None = None) -> float:
        """K and V of one token: all layers (None), only full-attention layers (False), only windowed ones (True)."""
        out = 0.0
        for b, w in zip(self._layer_bytes(kv), self.window_per_layer, strict=True):
            if windowed is None or windowed == (w > 0):
                out += b
        return out

    def _kv_terms(self, kv: KVSetting) -> tuple[float, tuple[tuple[float, int], ...]]:
        terms = self._kv_terms_cache.get(kv)
        if terms is None:
            layers = list(zip(self._layer_bytes(kv), self.window_per_layer, strict=True))
            terms = (sum(b for b, w in layers if w <= 0), tuple((b, w) for b, w in layers if w > 0))
            self._kv_terms_cache[kv] = terms
        return terms

    def kv_read_bytes(self, kv: KVSetting, context: float) -> float:
        """K(L): the KV bytes one agent's attention reads at context L (its own new token included)."""
        c = max(context, 0.0)
        full, windowed = self._kv_terms(kv)
        return full * c + sum(b * min(c, w) for b, w in windowed)

    def kv_equivalent_tokens(self, kv: KVSetting, context: float) -> float:
        """The context a full-attention cache of this model would read for the bytes K(L) reads: L itself
        for a dense model, less past a window. The step-time fit's KV term is in these tokens."""
        full, windowed = self._kv_terms(kv)
        if not windowed:  # a dense model: L itself (asked for every agent of every step)
            return max(context, 0.0)
        k = full + sum(b for b, _ in windowed)
        return self.kv_read_bytes(kv, context) / k if k > 0 else max(context, 0.0)

    def kv_cache_bytes(self, kv: KVSetting, context: float, swa_slack_tokens: int = 0) -> float:
        """What one agent's cache holds at context L with llama.cpp's swa_full off.

        A windowed layer keeps its window plus up to one ubatch (`swa_slack_tokens`): llama.cpp prunes
        the cells that fell out of the window before each ubatch, not after.
        """
        c = max(context, 0.0)
        return sum(b * (min(c, w + swa_slack_tokens) if w > 0 else c)
                   for b, w in zip(self._layer_bytes(kv), self.window_per_layer, strict=True))

    def llama_cpp_cache_bytes(self, kv: KVSetting, n_seqs: int, ctx_per_seq: int, n_ubatch: int) -> dict[str, int]:
        """The buffers llama.cpp allocates for n_seqs sequences (kv_unified off, swa_full off, flash attention on).

        "kv": full-attention layers, "kv_swa": windowed layers, "recurrent": the r/s state rows.
        Mirrors llama-context.cpp (n_ctx_seq), llama-kv-cache-iswa.cpp (SWA size) and llama-memory-recurrent.cpp.
        """
        n_ctx = _pad(n_seqs * ctx_per_seq, 256)
        cells_full = _pad(n_ctx // max(n_seqs, 1), 256)
        out = {"kv": 0, "kv_swa": 0, "recurrent": 0}
        for v, w in zip(self.kv_values_per_layer, self.window_per_layer, strict=True):
            if v <= 0:
                continue
            if w > 0:
                cells = _pad(min(cells_full, w + n_ubatch), SWA_CELL_PAD)
                out["kv_swa"] += int(kv.bytes_for(v, self.k_share) * cells * n_seqs)
            else:
                out["kv"] += int(kv.bytes_for(v, self.k_share) * cells_full * n_seqs)
        out["recurrent"] = int(self.state_bytes * max(n_seqs, 1))
        return out

    def budget_tokens(self, budget_bytes: float, kv: KVSetting, n_agents: int, ctx_per_agent: int,
                      swa_slack_tokens: int = 0) -> int:
        """Context tokens (summed over agents) a KV budget holds, after every agent's fixed part.

        The fixed part is each agent's recurrent state and its windowed layers' cells (llama.cpp allocates
        both per sequence, whatever the context); what is left pays for full-attention tokens.
        """
        per_token = self.kv_bytes_per_token(kv, windowed=False)
        swa = sum(b * min(ctx_per_agent, w + swa_slack_tokens)
                  for b, w in zip(self._layer_bytes(kv), self.window_per_layer, strict=True) if w > 0)
        left = budget_bytes - n_agents * (self.state_bytes + swa)
        if left < 0:
            return 0
        if per_token <= 0:  # nothing grows with context: the budget holds every agent's whole context or nothing
            return n_agents * ctx_per_agent
        return int(left // per_token)

    # the curve
    def step_bytes(self, kv: KVSetting, contexts: Sequence[float],
                   distinct_experts: float | Sequence[float] | None = None) -> float:
        """Bytes one decode step reads: W(B) + sum over the batch of (s + K(L_i))."""
        full, windowed = self._kv_terms(kv)
        if windowed:
            private = sum(self.state_bytes + self.kv_read_bytes(kv, c) for c in contexts)
        else:  # K(L) of every layer is full * L: the same sum, without a call per agent (every forecast step)
            private = sum(self.state_bytes + full * max(c, 0.0) for c in contexts)
        return self.weight_bytes(len(contexts), distinct_experts) + private

    def step_read(self, kv: KVSetting, contexts: Sequence[float], tokens: int,
                  distinct_experts: float | Sequence[float] | None = None) -> "StepRead":
        """What one step reads, each term computed once: the record's bytes and its predicted speedup
        both come from it. tokens: what the step carries (an untied embedding reads one row per token)."""
        return StepRead(kv_per_agent=[self.kv_read_bytes(kv, c) for c in contexts],
                        state_bytes=self.state_bytes, weight_one=self.weight_bytes(1),
                        weight_batch=self.weight_bytes(len(contexts), distinct_experts),
                        weight_step=self.weight_bytes(tokens, distinct_experts) if contexts else 0.0)

    def speedup(self, batch: int, context: float, kv: KVSetting,
                distinct_experts: float | Sequence[float] | None = None) -> float:
        """S(B, L) = B (W(1) + s + K(L)) / (W(B) + B (s + K(L))): every agent at context L."""
        return self.speedup_mixed([context] * batch, kv, distinct_experts)

    def speedup_mixed(self, contexts: Sequence[float], kv: KVSetting,
                      distinct_experts: float | Sequence[float] | None = None) -> float:
        """Agents at their own contexts: batch throughput over the mean batch-1 throughput at those contexts."""
        return self.step_read(kv, contexts, len(contexts), distinct_experts).speedup

    def private_bytes_per_token(self, kv: KVSetting, context: float) -> float:
        return self.state_bytes + self.kv_read_bytes(kv, context)

    def shared_bytes_per_token(self, batch: int, distinct_experts: float | Sequence[float] | None = None) -> float:
        return self.weight_bytes(batch, distinct_experts) / max(batch, 1)

    def crossover_context(self, batch: int, kv: KVSetting,
                          distinct_experts: float | Sequence[float] | None = None) -> float:
        """L*: where a token's private read (s + K(L)) equals its share of the weight read (W(B)/B).

        0 when the private read is already larger at L = 0; inf when K(L) stops growing before it gets there
        (every layer windowed, or the windows' share too small).
        """
        target = self.shared_bytes_per_token(batch, distinct_experts) - self.state_bytes
        if target <= 0:
            return 0.0
        # K(L) is piecewise linear and non-decreasing, with breaks at the windows: walk the pieces.
        lb = self._layer_bytes(kv)
        breaks = sorted({w for w in self.window_per_layer if w > 0})
        lo = 0.0
        for hi in [*breaks, math.inf]:
            k_lo = self.kv_read_bytes(kv, lo)
            slope = sum(b for b, w in zip(lb, self.window_per_layer, strict=True) if w == 0 or w > lo)
            if slope > 0:
                at = lo + (target - k_lo) / slope
                if at <= hi:
                    return at
            lo = hi
        return math.inf

    # serialisation
    def to_dict(self) -> dict[str, Any]:
        # the model's own fields, not its cache: asdict copied the per-type cache into every header too (and
        # cannot now: its keys are KV settings, which it would turn into dicts, and a dict is no key)
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        for key in ("expert_bytes_per_layer", "kv_values_per_layer", "window_per_layer", "notes"):
            d[key] = list(d[key])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ByteModel":
        return cls(
            dense_weight_bytes=float(d["dense_weight_bytes"]),
            embd_row_bytes=float(d.get("embd_row_bytes", 0.0)),
            expert_bytes_per_layer=tuple(float(x) for x in d.get("expert_bytes_per_layer", ())),
            n_expert=int(d.get("n_expert", 0)),
            n_expert_used=int(d.get("n_expert_used", 0)),
            kv_values_per_layer=tuple(float(x) for x in d.get("kv_values_per_layer", ())),
            window_per_layer=tuple(int(x) for x in d.get("window_per_layer", ())),
            state_bytes=float(d.get("state_bytes", 0.0)),
            k_share=float(d.get("k_share", 0.5)),  # older recordings: K and V alike
            source=str(d.get("source", "")),
            notes=tuple(str(x) for x in d.get("notes", ())),
        )


def bytes_model_from_header(h: dict[str, Any]) -> ByteModel | None:
    """The byte model a recording's header carries; for an older header, the dense one its W and k make."""
    d = h.get("bytes_model")
    if isinstance(d, dict):
        try:
            return ByteModel.from_dict(d)
        except (KeyError, TypeError, ValueError):
            pass
    w = h.get("weight_bytes") or 0
    per_type = h.get("kv_bytes_per_token") or {}
    for name, k in per_type.items():
        if (name in KV_TYPES or name == UNKNOWN_KV) and k:
            values = k / read_kv(name).bytes_for(1)
            return ByteModel.dense(w, values, float(h.get("embd_row_bytes") or 0.0),
                                   source="dense W and k from the header (an older recording)") if w else None
    return None

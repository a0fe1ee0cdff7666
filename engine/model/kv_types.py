"""The KV cache element types llama.cpp accepts, with their storage cost."""

from dataclasses import dataclass

from swarmtune.engine.errors import UserError


@dataclass(frozen=True)
class KVType:
    name: str
    ggml_type: int  # enum ggml_type in ggml.h
    block_values: int  # values per quantization block (1 for plain floats)
    block_bytes: int  # bytes per block, scales included

    @property
    def quantized(self) -> bool:
        return self.block_values > 1

    def bytes_for(self, n_values: float) -> float:
        return n_values * self.block_bytes / self.block_values


KV_TYPES: dict[str, KVType] = {
    t.name: t
    for t in (
        KVType("f16", 1, 1, 2),
        KVType("f32", 0, 1, 4),
        KVType("bf16", 30, 1, 2),
        KVType("q8_0", 8, 32, 34),
        KVType("q5_1", 7, 32, 24),
        KVType("q5_0", 6, 32, 22),
        KVType("q4_1", 3, 32, 20),
        KVType("q4_0", 2, 32, 18),
        KVType("iq4_nl", 20, 32, 18),
    )
}
DEFAULT_KV = "f16"
# K and V apart, as offered in the dashboard's picker (any pair may be typed): K is the more sensitive of
# the two (llama.cpp PR #7412), so the cheaper V comes first
MIXED_KV = ("f16/q8_0", "q8_0/f16", "q8_0/q4_0", "f16/q4_0")


def kv_type(name: str) -> KVType:
    try:
        return KV_TYPES[name]
    except KeyError:
        raise UserError(f"unknown KV type {name!r}; choose one of {', '.join(KV_TYPES)}", field="kv_type") from None


@dataclass(frozen=True)
class KvPair:
    """The K cache's type and the V cache's, apart (llama.cpp's -ctk / -ctv). Spelled "q8_0" where both are
    one type, "q8_0/f16" (K first) where they differ."""

    k: KVType
    v: KVType

    @property
    def label(self) -> str:
        return self.k.name if self.k == self.v else f"{self.k.name}/{self.v.name}"

    @property
    def quantized(self) -> bool:
        return self.k.quantized or self.v.quantized

    def bytes_for(self, n_values: float, k_share: float = 0.5) -> float:
        """Bytes of n_values K and V elements, k_share of them K's (a model's K and V heads may differ)."""
        return self.k.bytes_for(n_values * k_share) + self.v.bytes_for(n_values * (1.0 - k_share))


def kv_pair(text: str) -> KvPair:
    """"q8_0" (K and V alike) or "q8_0/f16" (K, then V); an unknown type or a bad spelling is one UserError."""
    if not isinstance(text, str) or not text.strip():
        raise UserError(f"a KV setting is a type or K/V types, e.g. q8_0 or q8_0/f16 (got {text!r})", field="kv_type")
    parts = [p.strip() for p in text.split("/")]
    if len(parts) > 2 or not all(parts):
        raise UserError(f"a KV setting is a type or K/V types, e.g. q8_0 or q8_0/f16 (got {text!r})", field="kv_type")
    k = kv_type(parts[0])
    return KvPair(k, kv_type(parts[-1]))

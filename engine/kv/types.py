"""The KV cache element types llama.cpp accepts, with their storage cost, and a KV setting: K's type and
V's, the one thing every layer passes around about the cache (read from its spelling once, where it
enters)."""

import functools
from dataclasses import dataclass, field

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


def kv_type(name: str) -> KVType:
    try:
        return KV_TYPES[name]
    except KeyError:
        raise UserError(f"unknown KV type {name!r}; choose one of {', '.join(KV_TYPES)}", field="kv_type") from None


@dataclass(frozen=True)
class KVSetting:
    """What the KV cache holds: the K cache's type and the V cache's, apart (llama.cpp's -ctk / -ctv).
    Spelled "q8_0" where both are one type, "q8_0/f16" (K first) where they differ; `parse` reads that
    spelling once, where a setting enters (a flag, a key, an HTTP body, a record read back), and everything
    past it holds this. Its str is the spelling, so a message or a record prints it as the user typed it."""

    k: KVType
    v: KVType
    # the spelling and the hash, made once: a setting keys the byte model's and the simulator's tables,
    # looked up for every agent of every simulated step of a forecast (a dataclass's own hash took 0.34 us)
    label: str = field(init=False, compare=False, repr=False)
    _hash: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "label", self.k.name if self.k == self.v else f"{self.k.name}/{self.v.name}")
        object.__setattr__(self, "_hash", hash(self.label))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return other is self or (isinstance(other, KVSetting) and other.label == self.label)

    @staticmethod
    def parse(text: str) -> "KVSetting":
        """"q8_0" (K and V alike) or "q8_0/f16" (K, then V); an unknown type or a bad spelling is one
        UserError."""
        if not isinstance(text, str) or not text.strip():
            raise UserError(f"a KV setting is a type or K/V types, e.g. q8_0 or q8_0/f16 (got {text!r})",
                            field="kv_type")
        return _parse(text)

    def __str__(self) -> str:
        return self.label

    def __format__(self, spec: str) -> str:  # f"{kv:8}" pads the spelling, as it did a str
        return format(self.label, spec)

    @property
    def quantized(self) -> bool:
        return self.k.quantized or self.v.quantized

    def bytes_for(self, n_values: float, k_share: float = 0.5) -> float:
        """Bytes of n_values K and V elements, k_share of them K's (a model's K and V heads may differ)."""
        return self.k.bytes_for(n_values * k_share) + self.v.bytes_for(n_values * (1.0 - k_share))


@functools.lru_cache(maxsize=256)  # records read back name a handful of settings, each many times
def _parse(text: str) -> KVSetting:
    parts = [p.strip() for p in text.split("/")]
    if len(parts) > 2 or not all(parts):
        raise UserError(f"a KV setting is a type or K/V types, e.g. q8_0 or q8_0/f16 (got {text!r})", field="kv_type")
    return KVSetting(kv_type(parts[0]), kv_type(parts[-1]))


def parse_kv_list(text: str) -> tuple[KVSetting, ...]:
    """Comma-separated KV settings (f16,q8_0,q8_0/f16), one of each, in the order named; none is a UserError."""
    out = tuple(dict.fromkeys(KVSetting.parse(k.strip()) for k in text.split(",") if k.strip()))
    if not out:
        raise UserError(f"name at least one KV setting, e.g. q8_0,q4_0,q8_0/f16 (got {text!r})", field="kv_type")
    return out


F16 = KVSetting(KV_TYPES["f16"], KV_TYPES["f16"])  # llama.cpp's default, and the quality check's reference
UNKNOWN_KV = "remote"  # a record's KV setting where an attached engine does not report its cache type


def known_kv(text: str) -> KVSetting | None:
    """A record's KV setting, None where the engine did not report it (an attached one's, or none yet)."""
    return None if text in (UNKNOWN_KV, "") else KVSetting.parse(text)


def read_kv(text: str) -> KVSetting:
    """A record's KV setting as the byte model counts it: an attached engine's unreported one at f16, the
    default of llama-server and vLLM."""
    return F16 if text == UNKNOWN_KV else KVSetting.parse(text)

# K and V apart, as offered in the dashboard's picker (any pair may be typed): K is the more sensitive of
# the two (llama.cpp PR #7412), so the cheaper V comes first
MIXED_KV = tuple(KVSetting.parse(t) for t in ("f16/q8_0", "q8_0/f16", "q8_0/q4_0", "f16/q4_0"))

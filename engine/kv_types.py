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


def kv_type(name: str) -> KVType:
    try:
        return KV_TYPES[name]
    except KeyError:
        raise UserError(f"unknown KV type {name!r}; choose one of {', '.join(KV_TYPES)}", field="kv_type") from None

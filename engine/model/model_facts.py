"""What a decode step reads, from the GGUF file itself (the `gguf` package, no llama.cpp needed)."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from swarmtune.engine.errors import UserError
from swarmtune.engine.kv.types import KV_TYPES, KVSetting
from swarmtune.engine.model.bytes_model import ByteModel
from swarmtune.engine.model.gguf_bytes import PURE_RECURRENT, bytes_model_from_gguf
from swarmtune.engine.model.gguf_header import GGUFHeader, HeaderError

GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class ModelFacts:
    path: str
    name: str
    architecture: str
    n_layer: int
    n_head: int
    n_head_kv_per_layer: tuple[int, ...]
    head_dim_k: int
    head_dim_v: int
    n_ctx_train: int
    file_bytes: int
    tensor_bytes: int
    weight_bytes: int  # what a batch-1 step reads of the weights, the embedding row aside (MoE: k experts a layer)
    embd_row_bytes: int  # one row of an untied token_embd, read once per token in the batch; 0 when tied
    tied_output: bool
    kv_values_per_token: float  # K and V elements one token adds, over all layers with a KV cache
    # what a step reads, layer by layer (windows, experts, recurrent state)
    bytes_model: ByteModel = field(compare=False)

    def kv_bytes_per_token(self, kv: KVSetting) -> float:
        """K and V of one token over all layers with a KV cache, block scales included.
        On windowed layers a token stops costing reads once it leaves the window: see bytes_model.kv_read_bytes."""
        return kv.bytes_for(self.kv_values_per_token, self.bytes_model.k_share)

    def kv_bytes_per_token_all(self) -> dict[str, float]:
        """By each type's name, K and V alike: a recording's header."""
        return {name: self.kv_bytes_per_token(KVSetting(t, t)) for name, t in KV_TYPES.items()}

    def step_weight_bytes(self, batch: int) -> int:
        """W(B) of a step carrying `batch` tokens (MoE: uniform routing, modeled)."""
        return int(round(self.bytes_model.weight_bytes(batch)))


def _field(reader: GGUFHeader, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def read_model_facts(path: str | Path) -> ModelFacts:
    p = Path(path)
    if not p.is_file():
        raise UserError(f"model file not found: {p}")
    with p.open("rb") as fh:
        if fh.read(4) != GGUF_MAGIC:
            raise UserError(f"not a GGUF file (bad magic): {p}")
    try:
        reader = GGUFHeader(p)
    except (HeaderError, OSError) as e:
        raise UserError(f"unreadable GGUF file {p}: {e}") from None
    file_bytes = p.stat().st_size
    tensors = {t.name: t for t in reader.tensors}
    for t in reader.tensors:
        if int(t.data_offset) + int(t.n_bytes) > file_bytes:
            raise UserError(f"truncated GGUF file {p}: tensor {t.name} runs past the end")
    arch = _field(reader, "general.architecture")
    if not arch:
        raise UserError(f"GGUF file {p} names no architecture")
    n_layer = int(_field(reader, f"{arch}.block_count", 0))
    n_head_raw = _field(reader, f"{arch}.attention.head_count", 0)
    n_head = int(np.max(n_head_raw)) if isinstance(n_head_raw, list) else int(n_head_raw)
    n_embd = int(_field(reader, f"{arch}.embedding_length", 0))
    # a pure recurrent model (Mamba, RWKV) has no attention heads at all
    if n_layer <= 0 or n_embd <= 0 or (n_head <= 0 and arch not in PURE_RECURRENT):
        raise UserError(f"GGUF file {p} lacks the attention shape (block_count, head_count, embedding_length)")
    head_per_layer = [int(x) for x in n_head_raw] if isinstance(n_head_raw, list) else [n_head] * n_layer
    kv_raw = _field(reader, f"{arch}.attention.head_count_kv", n_head_raw)
    # Some architectures give one KV head count per layer (0 for layers without attention).
    per_layer = tuple(int(x) for x in kv_raw) if isinstance(kv_raw, list) else (int(kv_raw),) * n_layer
    head_dim_k = int(_field(reader, f"{arch}.attention.key_length", n_embd // n_head if n_head else 0))
    head_dim_v = int(_field(reader, f"{arch}.attention.value_length", n_embd // n_head if n_head else 0))
    n_ctx_train = int(_field(reader, f"{arch}.context_length", 0))
    tied = "output.weight" not in tensors
    tensor_bytes = sum(int(t.n_bytes) for t in reader.tensors)
    try:
        bm = bytes_model_from_gguf(reader, str(arch), n_layer, n_embd, head_per_layer, list(per_layer),
                                   source=f"GGUF {p.name}: tensor sizes and {arch} layer layout (llama.cpp's rules)")
    except ValueError as e:  # e.g. experts without an expert_used_count: llama.cpp refuses such a file too
        raise UserError(f"GGUF file {p}: {e}") from None
    row_bytes = int(round(bm.embd_row_bytes))
    return ModelFacts(
        path=str(p.resolve()),
        name=str(_field(reader, "general.name", p.stem)),
        architecture=str(arch),
        n_layer=n_layer,
        n_head=n_head,
        n_head_kv_per_layer=per_layer,
        head_dim_k=head_dim_k,
        head_dim_v=head_dim_v,
        n_ctx_train=n_ctx_train,
        file_bytes=file_bytes,
        tensor_bytes=tensor_bytes,
        weight_bytes=int(round(bm.weight_bytes(1))) - row_bytes,
        embd_row_bytes=row_bytes,
        tied_output=tied,
        kv_values_per_token=float(sum(bm.kv_values_per_layer)),
        bytes_model=bm,
    )

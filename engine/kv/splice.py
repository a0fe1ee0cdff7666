"""A saved sequence's cells taken apart and put together again: how kept chunks of an old history are put
back after the new tokens before them were prefilled (engine/conversation/chunk_reuse.py).

llama.cpp decodes a sequence's tokens only at the position after its last cell, so cells cannot be
prefilled into a hole below cells the sequence still holds. The sequence is cut at the divergence instead;
the new tokens are prefilled there; then its state is saved, the kept chunk's cells (saved before the cut,
at positions above anything the sequence holds) are appended to it and the whole is set back, and
`llama_memory_seq_add` shifts the chunk down into place (llama.cpp re-rotates its K on the next decode).
The layout is the one engine/kv/convert.py reads; anything else is Unconvertible and the caller prefills."""

import struct
from dataclasses import dataclass

import numpy as np

from swarmtune.engine.kv.convert import STATE_MAGIC, Unconvertible, parse

META_BYTES = 12  # per cell: i32 pos, u32 n_seq_id (= 1), i32 seq_id


@dataclass(frozen=True)
class Cells:
    """One sequence's saved cells, apart: their positions and, per K and V tensor, their rows."""

    head: bytes  # magic, sequence, stream count and the empty streams before this one's
    tail: bytes  # the empty streams after it
    meta: np.ndarray  # (cells, 3) int32: position, 1, sequence
    v_trans: int
    tensors: tuple[tuple[int, int, np.ndarray], ...]  # (ggml type, row bytes, (cells, row bytes) uint8)

    @property
    def positions(self) -> np.ndarray:
        return self.meta[:, 0]

    @property
    def nbytes(self) -> int:
        return sum(rows.nbytes for _, _, rows in self.tensors)

    def between(self, lo: int, hi: int) -> "Cells":
        """The cells at positions lo..hi-1."""
        keep = (self.positions >= lo) & (self.positions < hi)
        return Cells(self.head, self.tail, self.meta[keep], self.v_trans,
                     tuple((t, rb, rows[keep]) for t, rb, rows in self.tensors))


def split(state: bytes | memoryview, n_layer: int) -> Cells:
    layout = parse(state, n_layer)  # validates the whole layout (Unconvertible otherwise)
    mv = memoryview(state).cast("B")
    o = 12  # magic, sequence, stream count
    while struct.unpack_from("<I", mv, o)[0] == 0:
        o += 4
    n = struct.unpack_from("<I", mv, o)[0]
    head = bytes(mv[:o])
    meta = np.frombuffer(mv, dtype=np.int32, count=3 * n, offset=o + 4).reshape(n, 3).copy()
    v_trans = struct.unpack_from("<I", mv, o + 4 + META_BYTES * n)[0]
    tensors = tuple((r.ggml_type, r.row_bytes,
                     np.frombuffer(mv, dtype=np.uint8, count=r.rows * r.row_bytes, offset=r.data)
                     .reshape(r.rows, r.row_bytes).copy()) for r in layout.rows)
    last = layout.rows[-1]
    return Cells(head, bytes(mv[last.data + last.rows * last.row_bytes :]), meta, v_trans, tensors)


def join(a: Cells, b: Cells) -> bytearray:
    """A state holding a's cells then b's (the sequence a was saved from)."""
    if len(a.tensors) != len(b.tensors) or any(x[:2] != y[:2] for x, y in zip(a.tensors, b.tensors, strict=True)):
        raise Unconvertible("the two states' K and V types differ")
    if len(b.meta) and np.isin(b.positions, a.positions).any():
        raise Unconvertible("the appended cells' positions are already held")
    meta = np.concatenate([a.meta, b.meta])
    meta[:, 2] = struct.unpack_from("<i", a.head, 4)[0]
    parts = [a.head, struct.pack("<I", len(meta)), meta.astype("<i4").tobytes(),
             struct.pack("<II", a.v_trans, len(a.tensors) // 2)]
    for (t, rb, rows_a), (_, _, rows_b) in zip(a.tensors, b.tensors, strict=True):
        parts += [struct.pack("<iQ", t, rb), rows_a.tobytes(), rows_b.tobytes()]
    parts.append(a.tail)
    out = bytearray(b"".join(parts))
    assert struct.unpack_from("<I", out, 0)[0] == STATE_MAGIC
    return out

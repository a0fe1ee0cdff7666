"""A sequence's cells in the live context: dropped, cut and pasted back at new positions, copied, saved to
host memory and restored, converted to another KV type (engine/kv/convert.py)."""

import ctypes
import time
from collections.abc import Sequence
from dataclasses import dataclass

import llama_cpp as ll

from swarmtune.engine.backends.backend import CacheMismatch, NoKVSlot
from swarmtune.engine.backends.llama_live import LiveContext, ModelHandle
from swarmtune.engine.conversation.chunk_reuse import Chunk
from swarmtune.engine.kv.splice import Cells
from swarmtune.engine.kv.types import KVSetting


class LlamaCells:
    """The cells of one live context's sequences."""

    def __init__(self, model: ModelHandle, live: LiveContext, shifts: bool) -> None:
        self.m, self.live = model, live
        self.shifts = shifts  # its cells can move to other positions (the backend's caps.shift)

    def drop(self, seq: int) -> None:
        ll.llama_memory_seq_rm(self.live.mem, seq, -1, -1)

    def truncate(self, seq: int, n_tokens: int) -> None:
        ll.llama_memory_seq_rm(self.live.mem, seq, n_tokens, -1)

    def copy(self, src: int, dst: int) -> None:
        ll.llama_memory_seq_rm(self.live.mem, dst, -1, -1)
        ll.llama_memory_seq_cp(self.live.mem, src, dst, -1, -1)

    def cut(self, seq: int, keep: int, chunks: Sequence[Chunk]) -> list[object]:
        """Keep seq's first `keep` cells; each chunk's cells are saved apart first, to be put back at their
        new place by paste() once the tokens before it are prefilled. [] where they cannot be (the caller
        prefills them)."""
        from swarmtune.engine.kv.convert import Unconvertible
        from swarmtune.engine.kv.splice import split

        if not chunks or not self.shifts:
            self.truncate(seq, keep)
            return []
        _, hi = self.span(seq)
        # a chunk that moves up is first moved up with the rest, past every position it will move through,
        # so that paste() puts it above the new tokens and only ever shifts it down
        up = max(0, max(c.shift for c in chunks))
        try:
            if up:
                ll.llama_memory_seq_add(self.live.mem, seq, keep, -1, up)
                self._apply_shift(seq, hi + up + 1)
            saved, _, _ = self.save_seq(seq)
            assert isinstance(saved, _SavedSeq)
            cells = split(memoryview(saved.data), self.m.facts.n_layer)
        except (NoKVSlot, Unconvertible):
            self.truncate(seq, keep)
            return []
        self.truncate(seq, keep)
        return [_Kept(cells.between(c.held_at + up, c.held_at + up + c.tokens), c.held_at + up, c.tokens, self.live.kv)
                for c in chunks]

    def _apply_shift(self, seq: int, pos: int) -> None:
        """llama.cpp re-rotates shifted K at the start of a decode: one token at pos, then removed."""
        b = self.live.batch
        b.n_tokens = 1
        b.token[0], b.pos[0], b.n_seq_id[0], b.seq_id[0][0], b.logits[0] = 0, pos, 1, seq, 0
        try:
            self.live.run()
        finally:
            ll.llama_memory_seq_rm(self.live.mem, seq, pos, -1)

    def paste(self, seq: int, kept: object, at: int) -> float:
        """Put a chunk cut() saved back at position `at`, right after seq's last cell; returns seconds.
        NoKVSlot (seq is then empty) where the cache has no room; CacheMismatch where the chunk is another
        cache type's."""
        from swarmtune.engine.kv.splice import join, split

        assert isinstance(kept, _Kept)
        if kept.kv != self.live.kv:
            raise CacheMismatch(f"sequence {seq}: a chunk cut at KV {kept.kv} pasted into a {self.live.kv} cache")
        t0 = time.perf_counter()
        if self.span(seq) == (-1, -1):
            base = kept.cells.between(0, 0)
        else:
            saved, _, _ = self.save_seq(seq)
            assert isinstance(saved, _SavedSeq)
            base = split(memoryview(saved.data), self.m.facts.n_layer)
        state = join(base, kept.cells)
        buf = (ctypes.c_uint8 * len(state)).from_buffer(state)
        if ll.llama_state_seq_set_data(self.live.ctx, buf, len(state), seq) == 0:
            raise NoKVSlot()
        if at != kept.pos:
            ll.llama_memory_seq_add(self.live.mem, seq, kept.pos, kept.pos + kept.tokens, at - kept.pos)
            # applied now, not at the next decode: a state saved before it (the next chunk's paste, a KV
            # switch's conversion) would carry the new positions with K still rotated for the old ones
            self._apply_shift(seq, at + kept.tokens)
        return time.perf_counter() - t0

    def save_seq(self, seq: int) -> tuple[object, int, float]:
        """llama.cpp's own per-sequence state (its cells' K and V rows, a recurrent state), copied to host."""
        t0 = time.perf_counter()
        n = ll.llama_state_seq_get_size(self.live.ctx, seq)
        buf = (ctypes.c_uint8 * n)()
        written = ll.llama_state_seq_get_data(self.live.ctx, buf, n, seq)
        if written != n:
            raise RuntimeError(f"llama_state_seq_get_data wrote {written} of {n} bytes for sequence {seq}")
        return _SavedSeq(buf, n, self.live.kv), n, time.perf_counter() - t0

    def restore_seq(self, seq: int, handle: object) -> float:
        assert isinstance(handle, _SavedSeq)
        if handle.kv != self.live.kv:  # the rows are in the old cache's type: llama.cpp would read them wrong
            raise CacheMismatch(f"sequence {seq}: a state saved at KV {handle.kv} restored into a {self.live.kv} cache")
        if handle.rot is not None and handle.rot != self.live.attn_rot:
            from swarmtune.engine.kv.convert import Unconvertible

            raise Unconvertible(f"converted for rotation {handle.rot}, but this cache rotates {self.live.attn_rot}")
        t0 = time.perf_counter()
        read = ll.llama_state_seq_set_data(self.live.ctx, handle.data, handle.nbytes, seq)
        if read == 0:  # llama.cpp found no room for the cells (and left the sequence empty)
            raise NoKVSlot()
        return time.perf_counter() - t0

    def convert_saved(self, handle: object, kv: KVSetting) -> tuple[object, float]:
        from swarmtune.engine.kv.convert import Unconvertible, convert, rotation

        assert isinstance(handle, _SavedSeq)
        t0 = time.perf_counter()
        f = self.m.facts
        rot_from, rot_to = (rotation(k, f.head_dim_k, f.head_dim_v) for k in (handle.kv, kv))
        if handle.kv == self.live.kv and tuple(bool(r) for r in rot_from) != self.live.attn_rot:
            raise Unconvertible(f"llama.cpp rotates this {self.live.kv} cache as {self.live.attn_rot}, not as expected")
        data = convert(memoryview(handle.data), f.n_layer, kv, self.m.n_threads, rot_from, rot_to)
        buf = (ctypes.c_uint8 * len(data)).from_buffer(data)
        return _SavedSeq(buf, len(data), kv, tuple(bool(r) for r in rot_to)), time.perf_counter() - t0

    def span(self, seq: int) -> tuple[int, int]:
        return ll.llama_memory_seq_pos_min(self.live.mem, seq), ll.llama_memory_seq_pos_max(self.live.mem, seq)


@dataclass(frozen=True)
class _Kept:
    """A chunk of a sequence's cells cut() saved, at the positions it was saved from."""

    cells: Cells
    pos: int
    tokens: int
    kv: KVSetting


@dataclass(frozen=True)
class _SavedSeq:
    data: "ctypes.Array[ctypes.c_uint8]"  # host memory
    nbytes: int
    kv: KVSetting
    rot: tuple[bool, ...] | None = None  # converted: the (K, V) rotation its rows are in

"""A KV switch without a re-prefill: a sequence's saved state converted to the new cache type on the host.

llama.cpp's per-sequence state (`llama_state_seq_get_data`) holds every cached K and V row. Its layout is
`state_write` / `state_write_data` in llama.cpp's `src/llama-kv-cache.cpp` (pinned through
llama-cpp-python 0.3.36):

    u32 magic 0xaf143cd8, i32 seq_id                                  (llama-context.cpp)
    u32 n_stream; per stream: u32 cell_count, and if cells:
      per cell: i32 pos, u32 n_seq_id, i32 seq_id x n_seq_id          (the meta)
      u32 v_trans, u32 n_layer
      per layer: i32 k_type, u64 k_row_bytes, k rows (cell_count of them)
      per layer: i32 v_type, u64 v_row_bytes, v rows                  (v_trans = 0)

Changing the cache type changes only the rows and the two fields before them, so each row is turned to
f32 and then into the new type by ggml's own routines (`ggml_get_type_traits(t).to_float`,
`ggml_quantize_chunk`), from the `libggml-base` that llama-cpp-python loads: the same code llama.cpp runs
when it writes a token's K and V into a quantized cache. The state is then set into the rebuilt context.

One more thing differs between a quantized cache and an f16 one: llama.cpp stores a quantized K (and V)
rotated by a Walsh-Hadamard matrix, each run of `nrot` values of a row multiplied by it (it spreads an
outlier over the block, so quantizing loses less), and rotates Q (and the attention's output) to match
(`attn_rot_k` / `attn_rot_v` in llama-kv-cache.cpp: a quantized type and a head size that is a multiple of
64; K's matrix is the largest power of two from 64 up that divides the head, V's is 64; the environment's
LLAMA_ATTN_ROT_DISABLE turns both off). The matrix is its own inverse, so a row moving between a rotated
and an unrotated type is multiplied by it once, in f32, between the two conversions.

Where the layout is not that one, it refuses (`Unconvertible`, with the reason) and the caller prefills
again: a transposed V (no flash attention), a sliding-window cache (two caches in one state), recurrent
state, cells with M-RoPE's extra positions, or anything whose sizes do not add up to the whole state.
"""

import ctypes
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from swarmtune.engine.kv.types import KVSetting

STATE_MAGIC = 0xAF143CD8  # llama-context.cpp's io_magic, first in every sequence state


class Unconvertible(Exception):
    """This state cannot be converted safely; the message says why (the caller prefills again)."""


@dataclass(frozen=True)
class _Rows:
    head: int  # offset of the i32 type field
    data: int  # offset of the first row
    rows: int
    row_bytes: int
    ggml_type: int


@dataclass(frozen=True)
class _Layout:
    rows: tuple[_Rows, ...]  # every K tensor then every V tensor, in the state's order
    size: int


class _Ggml:
    """ggml's type traits and quantizer, from the library llama-cpp-python already loaded."""

    class Traits(ctypes.Structure):
        _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                    ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                    ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                    ("from_float_ref", ctypes.c_void_p)]

    class CpuTraits(ctypes.Structure):
        _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p), ("vec_dot_type", ctypes.c_int),
                    ("nrows", ctypes.c_int64)]

    ToFloat = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
    FromFloat = ToFloat  # (const float *, void *, int64_t): the same shape the other way

    def __init__(self, lib: ctypes.CDLL, cpu: ctypes.CDLL | None) -> None:
        self.lib = lib
        # the CPU backend's own row quantizer (SIMD): what llama.cpp runs when it writes K and V into a
        # quantized cache on the CPU; ggml_quantize_chunk's reference rows are the same numbers, slower
        self.cpu = cpu
        if cpu is not None:
            cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(self.CpuTraits)
            cpu.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
        lib.ggml_get_type_traits.restype = ctypes.POINTER(self.Traits)
        lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
        lib.ggml_quantize_chunk.restype = ctypes.c_size_t
        lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                            ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
        lib.ggml_row_size.restype = ctypes.c_size_t
        lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]

    def traits(self, t: int) -> "_Ggml.Traits":
        traits: _Ggml.Traits = self.lib.ggml_get_type_traits(t).contents
        return traits

    def values_per_row(self, t: int, row_bytes: int) -> int:
        tr = self.traits(t)
        if row_bytes % tr.type_size:
            raise Unconvertible(f"a row of {row_bytes} bytes is no whole number of {tr.type_name.decode()} blocks")
        return int(row_bytes // tr.type_size * tr.blck_size)

    def to_f32(self, t: int, src_ptr: int, n: int, out: np.ndarray) -> None:
        if t == 0:  # GGML_TYPE_F32
            ctypes.memmove(out.ctypes.data, src_ptr, 4 * n)
            return
        fn = self.traits(t).to_float
        if not fn:
            raise Unconvertible(f"ggml has no dequantizer for type {t}")
        self.ToFloat(fn)(src_ptr, out.ctypes.data, n)

    def from_f32(self, t: int, src: np.ndarray, rows: int, per_row: int, dst_ptr: int) -> int:
        if t == 0:
            ctypes.memmove(dst_ptr, src.ctypes.data, 4 * src.size)
            return 4 * src.size
        fn = self.cpu.ggml_get_type_traits_cpu(t).contents.from_float if self.cpu is not None else None
        if fn:
            self.FromFloat(fn)(src.ctypes.data, dst_ptr, src.size)
            return rows * int(self.lib.ggml_row_size(t, per_row))
        return int(self.lib.ggml_quantize_chunk(t, src.ctypes.data, dst_ptr, 0, rows, per_row, None))


@cache
def ggml() -> _Ggml:
    """The libggml-base next to llama-cpp-python's libllama (the same build the engine runs)."""
    import llama_cpp

    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    found = sorted(lib_dir.glob("libggml-base.*")) or sorted(lib_dir.glob("ggml-base.*"))
    if not found:
        raise Unconvertible(f"no libggml-base in {lib_dir}")
    cpu = sorted(lib_dir.glob("libggml-cpu.*")) or sorted(lib_dir.glob("ggml-cpu.*"))
    return _Ggml(ctypes.CDLL(str(found[0])), ctypes.CDLL(str(cpu[0])) if cpu else None)


def parse(state: bytes | memoryview, n_layer: int) -> _Layout:
    """Where the K and V rows of a saved sequence are; Unconvertible where the layout is not the one above."""
    mv = memoryview(state).cast("B")
    size = len(mv)
    o = 0

    def u32() -> int:
        nonlocal o
        if o + 4 > size:
            raise Unconvertible("the state ends inside a field")
        (v,) = struct.unpack_from("<I", mv, o)
        o += 4
        return int(v)

    if u32() != STATE_MAGIC:
        raise Unconvertible("not a llama.cpp sequence state (its magic differs)")
    o += 4  # the sequence it was saved from
    n_stream = u32()
    if not 0 < n_stream <= 4096:
        raise Unconvertible(f"implausible stream count {n_stream}")
    rows: list[_Rows] = []
    for _ in range(n_stream):
        cells = u32()
        if cells == 0:
            continue
        if rows:
            raise Unconvertible("cells in more than one stream")
        for _ in range(cells):
            o += 4  # pos
            n_seq = u32()
            if n_seq != 1:
                raise Unconvertible(f"a cell of {n_seq} sequences (or cells with extra positions)")
            o += 4 * n_seq
        v_trans, layers = u32(), u32()
        if v_trans != 0:
            raise Unconvertible("V is stored transposed (no flash attention)")
        if layers != n_layer:
            raise Unconvertible(f"the state has {layers} layers, the model {n_layer}")
        for _ in range(2 * layers):
            if o + 12 > size:
                raise Unconvertible("the state ends inside a layer header")
            t, row = struct.unpack_from("<iQ", mv, o)
            rows.append(_Rows(o, o + 12, cells, row, t))
            o += 12 + cells * row
    if o != size:
        raise Unconvertible(f"the layout accounts for {o} of the state's {size} bytes")
    if not rows:
        raise Unconvertible("the state holds no cells")
    return _Layout(tuple(rows), size)


def rotation(kv: KVSetting, head_dim_k: int, head_dim_v: int) -> tuple[int, int]:
    """(K, V): the size of the Hadamard matrix llama.cpp rotates a cache of setting kv by, 0 for none: K's
    where K's type is quantized, V's where V's is (llama-kv-cache.cpp decides each apart)."""
    if os.environ.get("LLAMA_ATTN_ROT_DISABLE", "0") not in ("", "0"):
        return 0, 0
    k = 0
    if kv.k.quantized and head_dim_k > 0 and head_dim_k % 64 == 0:
        k = 64
        while head_dim_k % (2 * k) == 0:
            k *= 2
    v = 64 if kv.v.quantized and head_dim_v > 0 and head_dim_v % 64 == 0 else 0
    return k, v


@cache
def hadamard(n: int) -> np.ndarray:
    """The orthonormal Walsh-Hadamard matrix llama.cpp builds (ggml_gen_hadamard): H·H = I."""
    h = np.ones((1, 1), dtype=np.float32)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    out: np.ndarray = (h / np.sqrt(n)).astype(np.float32)
    return out


def convert(state: bytes | memoryview, n_layer: int, to_kv: KVSetting, threads: int = 2,
            rot_from: tuple[int, int] = (0, 0), rot_to: tuple[int, int] = (0, 0)) -> bytearray:
    """The same state with every K row in to_kv's K type and every V row in its V type ("q8_0/f16": K at
    q8_0, V at f16). rot_from, rot_to: the (K, V) Hadamard sizes of the old and the new cache (rotation())."""
    layout = parse(state, n_layer)
    g = ggml()
    new_types = (to_kv.k.ggml_type, to_kv.v.ggml_type)
    src = memoryview(state).cast("B")  # a ctypes array views as "<B"
    plan = []
    out_size = layout.size
    for i, r in enumerate(layout.rows):
        per_row = g.values_per_row(r.ggml_type, r.row_bytes)
        kv_i = 0 if i < n_layer else 1  # K tensors first, then V
        new_t = new_types[kv_i]
        if rot_from[kv_i] != rot_to[kv_i] and per_row % max(rot_from[kv_i], rot_to[kv_i]):
            raise Unconvertible(f"rows of {per_row} values do not split into the cache's rotation")
        new_row = g.lib.ggml_row_size(new_t, per_row)
        if per_row % g.traits(new_t).blck_size:
            raise Unconvertible(f"rows of {per_row} values are no whole number of {to_kv} blocks")
        plan.append((r, per_row, new_row, rot_from[kv_i] or rot_to[kv_i] if rot_from[kv_i] != rot_to[kv_i] else 0,
                     new_t))
        out_size += r.rows * (new_row - r.row_bytes)
    out = bytearray(out_size)
    dst = memoryview(out)
    jobs = []
    s_at = d_at = 0
    for r, per_row, new_row, rot, new_t in plan:
        head = r.head - s_at
        dst[d_at:d_at + head] = src[s_at:r.head]  # everything between this tensor and the last
        d_at += head
        struct.pack_into("<iQ", out, d_at, new_t, new_row)
        d_at += 12
        jobs.append((r, per_row, d_at, new_row, rot, new_t))
        d_at += r.rows * new_row
        s_at = r.data + r.rows * r.row_bytes
    dst[d_at:] = src[s_at:]

    src_at = np.frombuffer(src, dtype=np.uint8).ctypes.data  # read-only states too: ggml only reads them
    dst_at = np.frombuffer(out, dtype=np.uint8).ctypes.data

    def one(job: tuple[_Rows, int, int, int, int, int]) -> None:
        r, per_row, at, new_row, rot, new_t = job
        n = r.rows * per_row
        f32 = np.empty(n, dtype=np.float32)
        g.to_f32(r.ggml_type, src_at + r.data, n, f32)
        if rot:  # into or out of the rotated basis (H is its own inverse and symmetric)
            f32 = np.ascontiguousarray((f32.reshape(-1, rot) @ hadamard(rot)).reshape(-1))
        wrote = g.from_f32(new_t, f32, r.rows, per_row, dst_at + at)
        if wrote != r.rows * new_row:
            raise Unconvertible(f"ggml wrote {wrote} of {r.rows * new_row} bytes")

    with ThreadPoolExecutor(max(1, threads)) as pool:  # ggml's routines run without the GIL
        list(pool.map(one, jobs))
    return out

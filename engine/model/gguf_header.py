"""A GGUF file's header, its key-value fields and its tensors' infos, read without the tensors' data.

gguf's GGUFReader maps every element of every array field to a numpy view of its own: on the default
model (a 49,152-token vocabulary: its tokens, scores, types and merges) that took 2.6-3.8 s here, on every
start of the engine. The model's facts need a few scalars, a few per-layer arrays and each tensor's
shape and type. This reads the layout (github.com/ggml-org/ggml/blob/master/docs/gguf.md) with struct,
keeps a string array as where it lies (it is decoded only if asked for), and takes the types and block
sizes from gguf's own tables. It offers the two things the facts read of GGUFReader (`fields[key]
.contents()`, and `tensors` with `name`, `shape`, `n_bytes`, `data_offset`), so either reads a file alike.
"""

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

DEFAULT_ALIGNMENT = 32  # GGUF's, where general.alignment is absent

# GGUF value types: (struct format, numpy dtype) for the fixed-size ones
_STRING, _ARRAY = 8, 9
_SCALARS: dict[int, tuple[str, str]] = {
    0: ("<B", "<u1"), 1: ("<b", "<i1"), 2: ("<H", "<u2"), 3: ("<h", "<i2"), 4: ("<I", "<u4"), 5: ("<i", "<i4"),
    6: ("<f", "<f4"), 7: ("<?", "<u1"), 10: ("<Q", "<u8"), 11: ("<q", "<i8"), 12: ("<d", "<f8"),
}
_BOOL = 7


class HeaderError(ValueError):
    """The header is cut short or is not what GGUF lays out."""


@dataclass(frozen=True)
class Field:
    """One key's value: a scalar, a string, or an array (numbers read at once, strings when asked)."""

    value: Any
    strings: tuple[memoryview, int, int] | None = None  # a string array: (the file, offset, count)

    def contents(self) -> Any:
        if self.strings is None:
            return self.value
        buf, offs, count = self.strings
        out = []
        for _ in range(count):
            (n,) = struct.unpack_from("<Q", buf, offs)
            out.append(bytes(buf[offs + 8 : offs + 8 + n]).decode("utf-8", errors="replace"))
            offs += 8 + n
        return out


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: np.ndarray  # GGUF's order: the fastest-varying dimension first, as GGUFReader gives it
    tensor_type: GGMLQuantizationType
    n_bytes: int
    data_offset: int  # from the start of the file


class GGUFHeader:
    def __init__(self, path: str | Path) -> None:
        with open(path, "rb") as fh:
            try:
                self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError as e:  # an empty file
                raise HeaderError(str(e)) from None
        buf = memoryview(self._map)
        try:
            self.fields, self.tensors = _parse(buf)
        except HeaderError:
            raise
        except (struct.error, ValueError, IndexError, KeyError) as e:  # ValueError: an unknown tensor type too
            raise HeaderError(f"cut short or malformed header ({type(e).__name__}: {e})") from None


class _Cursor:
    def __init__(self, buf: memoryview) -> None:
        self.buf, self.offs = buf, 0

    def take(self, fmt: str) -> Any:
        (v,) = struct.unpack_from(fmt, self.buf, self.offs)
        self.offs += struct.calcsize(fmt)
        return v

    def string(self) -> str:
        n = self.take("<Q")
        if self.offs + n > len(self.buf):
            raise HeaderError("a string runs past the end of the file")
        s = bytes(self.buf[self.offs : self.offs + n]).decode("utf-8")
        self.offs += n
        return s

    def value(self, vtype: int) -> Field:
        if vtype == _STRING:
            return Field(self.string())
        if vtype in _SCALARS:
            v = self.take(_SCALARS[vtype][0])
            return Field(bool(v) if vtype == _BOOL else v)
        if vtype != _ARRAY:
            raise HeaderError(f"unknown value type {vtype}")
        etype, count = self.take("<I"), self.take("<Q")
        if etype == _STRING:
            start = self.offs
            for _ in range(count):  # skipped by their lengths: decoded only if asked for
                self.offs += 8 + struct.unpack_from("<Q", self.buf, self.offs)[0]
            if self.offs > len(self.buf):
                raise HeaderError("a string array runs past the end of the file")
            return Field(None, strings=(self.buf, start, count))
        if etype not in _SCALARS:
            raise HeaderError(f"an array of value type {etype}")
        dtype = np.dtype(_SCALARS[etype][1])
        n = dtype.itemsize * count
        if self.offs + n > len(self.buf):
            raise HeaderError("an array runs past the end of the file")
        a = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.offs)
        self.offs += n
        return Field([bool(x) for x in a] if etype == _BOOL else a.tolist())


def _parse(buf: memoryview) -> tuple[dict[str, Field], list[TensorInfo]]:
    c = _Cursor(buf)
    if bytes(buf[:4]) != b"GGUF":
        raise HeaderError("bad magic")
    c.offs = 4
    version = c.take("<I")
    if version not in (2, 3):
        raise HeaderError(f"GGUF version {version} (this reads 2 and 3, little-endian)")
    n_tensors, n_kv = c.take("<Q"), c.take("<Q")
    fields: dict[str, Field] = {}
    for _ in range(n_kv):
        key = c.string()
        fields[key] = c.value(c.take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = c.string()
        dims = np.array([c.take("<Q") for _ in range(c.take("<I"))], dtype=np.uint64)
        ggml_type = GGMLQuantizationType(c.take("<I"))
        infos.append((name, dims, ggml_type, c.take("<Q")))
    align_field = fields.get("general.alignment")
    align = int(align_field.value) if align_field is not None else DEFAULT_ALIGNMENT
    start = c.offs + (-c.offs % align)
    tensors = []
    for name, dims, ggml_type, offs in infos:
        block, size = GGML_QUANT_SIZES[ggml_type]
        n_elements = int(np.prod(dims)) if len(dims) else 1
        tensors.append(TensorInfo(name, dims, ggml_type, n_elements * size // block, start + int(offs)))
    return fields, tensors

"""The devices this llama.cpp build can offload to, as ggml's backend registry names them.

llama-cpp-python binds llama.h only; ggml's device API (ggml-backend.h) lives in libggml, which libllama
loads, so its symbols resolve through the same handle. A software device (Mesa's llvmpipe, SwiftShader)
is a real device backend (buffers, queues, a device that finishes after the call returns) that runs on
the CPU: it proves a code path, never a speed, so every label built here says so.
"""

import ctypes
from dataclasses import asdict, dataclass
from functools import cache
from typing import Any

import llama_cpp as ll

from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.model.bytes_model import ByteModel

# enum ggml_backend_dev_type
_KINDS = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}
# Vulkan implementations that execute on the host: lavapipe reports itself as "llvmpipe (LLVM ...)"
SOFTWARE_DEVICES = ("llvmpipe", "lavapipe", "swiftshader", "softpipe")


@dataclass(frozen=True)
class Device:
    api: str  # the ggml backend that drives it: Vulkan, CUDA, ROCm, Metal, ...
    name: str  # ggml's name for it: Vulkan0, CUDA0
    description: str  # the driver's: "llvmpipe (LLVM 15.0.6, 256 bits)", "NVIDIA H100 80GB HBM3"
    kind: str  # gpu | igpu | accel
    memory_total_bytes: int
    memory_free_bytes: int
    max_buffer_bytes: int  # the largest one buffer may be (Vulkan: maxMemoryAllocationSize and the like)
    # where a tensor view may start in its buffer (Vulkan: minStorageBufferOffsetAlignment)
    buffer_alignment: int = 1

    @property
    def emulated(self) -> bool:
        """A software implementation that runs on the CPU: its figures say nothing about a GPU."""
        return any(s in self.description.lower() for s in SOFTWARE_DEVICES)

    @property
    def short_name(self) -> str:
        """The description without the driver's parenthesised details."""
        return self.description.split(" (")[0].strip() or self.name

    @property
    def label(self) -> str:
        """What the status line and the records say: `Vulkan: llvmpipe (CPU-emulated)`."""
        return f"{self.api}: {self.short_name}" + (" (CPU-emulated)" if self.emulated else "")

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "emulated": self.emulated, "label": self.label}


@cache  # the signatures are set once; the handle is libllama's own
def _lib() -> Any:
    lib = ll.llama_cpp._lib
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_count.argtypes = []
    lib.ggml_backend_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    for fn in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
        getattr(lib, fn).restype = ctypes.c_char_p
        getattr(lib, fn).argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_type.restype = ctypes.c_int
    lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_memory.restype = None
    lib.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                            ctypes.POINTER(ctypes.c_size_t)]
    lib.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
    lib.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_reg_name.restype = ctypes.c_char_p
    lib.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_buffer_type.restype = ctypes.c_void_p
    lib.ggml_backend_dev_buffer_type.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_buft_get_max_size.restype = ctypes.c_size_t
    lib.ggml_backend_buft_get_max_size.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_buft_get_alignment.restype = ctypes.c_size_t
    lib.ggml_backend_buft_get_alignment.argtypes = [ctypes.c_void_p]
    return lib


def _text(b: bytes | None) -> str:
    return (b or b"").decode("utf-8", errors="replace")


def _memory(lib: Any, dev: int) -> tuple[int, int]:
    """(free, total) bytes of one device, as its backend reports them now."""
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
    return int(free.value), int(total.value)


def offload_devices() -> list[Device]:
    """Every non-CPU device llama.cpp would offload layers to, in its order (the first takes a single-device
    model). Empty on a CPU build, and on a Vulkan build that finds no usable device (ggml-vulkan skips a
    CPU-type device such as llvmpipe unless GGML_VK_VISIBLE_DEVICES names it)."""
    lib = _lib()
    out = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        kind = _KINDS.get(lib.ggml_backend_dev_type(dev), "cpu")
        if kind == "cpu":
            continue
        free, total = _memory(lib, dev)
        api = _text(lib.ggml_backend_reg_name(lib.ggml_backend_dev_backend_reg(dev)))
        buft = lib.ggml_backend_dev_buffer_type(dev)
        out.append(Device(api=api, name=_text(lib.ggml_backend_dev_name(dev)),
                          description=_text(lib.ggml_backend_dev_description(dev)), kind=kind,
                          memory_total_bytes=total, memory_free_bytes=free,
                          max_buffer_bytes=int(lib.ggml_backend_buft_get_max_size(buft)),
                          buffer_alignment=int(lib.ggml_backend_buft_get_alignment(buft))))
    return out


def free_bytes(device: Device) -> int:
    """The device's free memory now (the model's weights and the caches already made are taken)."""
    lib = _lib()
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        if _text(lib.ggml_backend_dev_name(dev)) == device.name:
            return _memory(lib, dev)[0]
    return device.memory_free_bytes


def cache_tensor_bytes(bm: ByteModel, kv: KVSetting, n_seqs: int, ctx_per_seq: int, n_batch: int) -> tuple[int, int]:
    """(the largest tensor, the whole size) of the cache llama.cpp makes for this: one layer's K or V over
    every sequence's cells (rounded up to 256, as llama.cpp pads them), and every cache together."""
    total = sum(bm.llama_cpp_cache_bytes(kv, n_seqs, ctx_per_seq, n_batch).values())
    cells = -(-n_seqs * ctx_per_seq // 256) * 256
    per_layer = max(bm.kv_values_per_layer, default=0)  # K and V values a token adds in one layer
    k_share = bm.k_share
    tensor = int(cells * max(kv.k.bytes_for(per_layer * k_share), kv.v.bytes_for(per_layer * (1 - k_share))))
    return tensor, total


def why_no_device_sampling(device: Device, n_vocab: int) -> str | None:
    """None where llama.cpp can sample on this device; else why not, in one line. Its sampling graph views
    each output row of the logits at row x n_vocab x 4 bytes; where that is not a multiple of the device's
    buffer alignment, ggml-vulkan aborts the process (GGML_ASSERT misalign_bytes == 0, found on llvmpipe
    with a 259-token vocabulary). A real model's vocabulary is mostly padded to a multiple of 64."""
    row_bytes = 4 * n_vocab
    if device.buffer_alignment > 1 and row_bytes % device.buffer_alignment:
        return (f"a logits row of {row_bytes:,} bytes does not start aligned to {device.name}'s "
                f"{device.buffer_alignment} bytes: sampled on the host")
    return None


def why_cache_does_not_fit(device: Device, tensor_bytes: int, total_bytes: int, free: int) -> str | None:
    """None where a cache whose largest tensor (one layer's K or V over every sequence) and whole size are
    these fits the device; else why not, in one line. llama.cpp does not refuse such a cache: on Vulkan it
    aborts the process ("pre-allocated tensor ... in a buffer that cannot run the operation"), so the
    engine asks first."""
    gib = 1 << 30
    if tensor_bytes > device.max_buffer_bytes:
        return (f"a KV cache of {total_bytes / gib:.2f} GiB needs {tensor_bytes / gib:.2f} GiB in one layer's buffer, "
                f"past {device.name}'s largest buffer ({device.max_buffer_bytes / gib:.2f} GiB): fewer agents, "
                "a shorter context per agent or a smaller KV type")
    if total_bytes > free:
        return (f"a KV cache of {total_bytes / gib:.2f} GiB does not fit {device.name}'s {free / gib:.2f} GiB free: "
                "fewer agents, a shorter context per agent or a smaller KV type")
    return None


def device_handles(cpu_only: bool) -> ctypes.Array[ctypes.c_void_p] | None:
    """For llama_model_params.devices: None lets llama.cpp use every device; an empty (NULL-terminated)
    list keeps the model, its cache and every op on the CPU, even on a GPU build (no op offload either)."""
    if not cpu_only:
        return None
    return (ctypes.c_void_p * 1)(None)

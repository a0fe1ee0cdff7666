"""llama.cpp's log, kept: its lines are read for what the API does not say (cache sizes, offloaded layers,
rotation), and none is printed. Importing this module installs the callback and initializes llama.cpp."""

import ctypes
import threading

import llama_cpp as ll

_log_lines: list[str] = []
_log_kept = 0  # lines kept since the start (a mark for "the lines since ...")
_log_lock = threading.Lock()


def _log_lines_kept(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    # llama.cpp chatters on stderr; keep its lines (the KV size check reads them) and print none.
    line = text.decode("utf-8", errors="replace")
    # Keep warnings, errors and buffer sizes; the per-tensor graph chatter would crowd them out.
    if level not in (2, 3) and "size" not in line and "offloaded" not in line:
        return
    global _log_kept
    with _log_lock:
        _log_lines.append(line)
        _log_kept += 1
        del _log_lines[:-400]


_log_callback = ll.llama_log_callback(_log_lines_kept)  # kept referenced: llama.cpp holds only the pointer
ll.llama_log_set(_log_callback, ctypes.c_void_p(0))
ll.llama_backend_init()


def llama_log_mark() -> int:
    with _log_lock:
        return _log_kept


def llama_log_since(mark: int) -> list[str]:
    """The kept lines logged after llama_log_mark() returned `mark` (at most the last 400)."""
    with _log_lock:
        n = min(_log_kept - mark, len(_log_lines))
        return list(_log_lines[-n:]) if n > 0 else []


def offloaded_layers(lines: list[str]) -> int:
    """llama.cpp's own count at load time: "load_tensors: offloaded 3/3 layers to GPU"."""
    for ln in reversed(lines):
        if "offloaded" in ln and "layers to" in ln:
            try:
                return int(ln.split("offloaded", 1)[1].split("/", 1)[0])
            except ValueError:
                return 0
    return 0


def caches_from_log(lines: list[str]) -> dict[str, int]:
    """Bytes of each cache a context made, from llama.cpp's log lines (two decimals of MiB):
    'kv' (full attention), 'kv_swa' (sliding-window layers, llama_kv_cache_iswa), 'recurrent'."""
    out: dict[str, int] = {}
    kind = "kv"
    for line in lines:
        if "creating     SWA KV cache" in line:
            kind = "kv_swa"
        elif "creating non-SWA KV cache" in line:
            kind = "kv"
        elif "llama_kv_cache: size =" in line or "llama_memory_recurrent: size =" in line:
            mib = float(line.split("size =")[1].split("MiB")[0])
            key = "recurrent" if line.startswith("llama_memory_recurrent") else kind
            out[key] = out.get(key, 0) + int(round(mib * 1024 * 1024))
    return out

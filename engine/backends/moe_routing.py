"""Measured MoE routing: how many distinct experts a decode step's tokens pick, layer by layer.

llama.cpp names each MoE layer's routing result `ffn_moe_topk-<layer>` ([k, n_tokens] int32 expert ids,
llama-graph.cpp build_moe_ffn). A context's eval callback (`cb_eval`) is asked about every graph node
and may read the ones it asks for; asking splits the graph at that node and synchronises, so the
counter asks only while `active` (decode steps), and answers the other nodes as fast as Python can.
"""

import ctypes
from typing import Any

TOPK_PREFIX = b"ffn_moe_topk-"
GGML_MAX_DIMS = 4
GGML_MAX_OP_PARAMS = 64
GGML_MAX_SRC = 10
GGML_MAX_NAME = 64
GGML_TYPE_I32 = 26


class GgmlTensor(ctypes.Structure):
    """struct ggml_tensor (ggml/include/ggml.h of the vendored llama.cpp); only read, never allocated."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
        ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * GGML_MAX_SRC),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * GGML_MAX_NAME),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


_NAME_OFFSET = GgmlTensor.name.offset
_PREFIX_LEN = len(TOPK_PREFIX)


def _ggml_lib() -> Any:
    """libggml as llama-cpp-python loads it (the tensor reads go through it, so a GPU buffer works too)."""
    from llama_cpp._ggml import libggml

    libggml.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    libggml.ggml_backend_tensor_get.restype = None
    libggml.ggml_nbytes.argtypes = [ctypes.c_void_p]
    libggml.ggml_nbytes.restype = ctypes.c_size_t
    libggml.ggml_get_name.argtypes = [ctypes.c_void_p]
    libggml.ggml_get_name.restype = ctypes.c_char_p
    return libggml


class RoutingCounter:
    """Distinct experts per MoE layer over the tokens of the steps between begin() and end()."""

    def __init__(self) -> None:
        import llama_cpp as ll

        self._lib = _ggml_lib()
        self.active = False
        self.failed = ""  # why the counter stopped, if it did (a layout it does not understand)
        self._checked = False
        self._distinct: dict[int, int] = {}
        # kept on self: llama.cpp holds only the raw pointer
        self.callback = ll.ggml_backend_sched_eval_callback(self._eval)

    def begin(self) -> None:
        self._distinct.clear()
        self.active = not self.failed

    def end(self) -> list[int] | None:
        """Distinct experts in each MoE layer the step ran, in layer order; None if none were seen."""
        self.active = False
        if not self._distinct:
            return None
        return [self._distinct[k] for k in sorted(self._distinct)]

    def _eval(self, t: int | None, ask: bool, user_data: int | None) -> bool:
        # Asked about every node of every graph: the common answer must cost one string read.
        if not self.active or t is None or ctypes.string_at(t + _NAME_OFFSET, _PREFIX_LEN) != TOPK_PREFIX:
            return not ask  # not needed; and never cancel the compute (False after a read aborts it)
        if ask:
            return True
        try:
            self._read(t)
        except Exception as e:  # noqa: BLE001  (an exception here would abort llama_decode in C)
            self.failed = f"routing read failed: {e}"
            self.active = False
        return True

    def _read(self, t: int) -> None:
        x = GgmlTensor.from_address(t)
        if not self._checked:  # the struct layout must match this build's; check it on the first tensor
            if self._lib.ggml_get_name(t) != x.name or x.type != GGML_TYPE_I32:
                raise RuntimeError("ggml_tensor layout differs from this build's")
            self._checked = True
        k, n_tokens, row_ints = int(x.ne[0]), int(x.ne[1]), int(x.nb[1]) // 4
        # a view of the argsort result: n_tokens rows of k ids, row_ints apart; read the span they cover
        n_ints = (n_tokens - 1) * row_ints + k
        buf = (ctypes.c_int32 * n_ints)()
        self._lib.ggml_backend_tensor_get(t, buf, 0, n_ints * 4)
        ids = set()
        for row in range(0, n_tokens * row_ints, row_ints):
            ids.update(buf[row : row + k])
        layer = int(x.name[_PREFIX_LEN:] or -1)
        self._distinct[layer] = len(ids)

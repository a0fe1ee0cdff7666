"""The live context: one llama.cpp context and everything that belongs to it (its memory, KV type, sequences,
rotation, samplers, batch and last prefill row), owned by one object. The parts that act on it (cells, steps)
are given it, never the backend, so a side cache is simply another LiveContext: the backend swaps one
reference and restores the live one with one assignment. The model's constants are a frozen ModelHandle."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import llama_cpp as ll

from swarmtune.engine.backends.backend import NoKVSlot
from swarmtune.engine.backends.llama_sampling import Samplers
from swarmtune.engine.errors import Interrupted
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.model.model_facts import ModelFacts


@dataclass(frozen=True)
class ModelHandle:
    """What every context of one loaded model shares, and never changes."""

    model: Any  # llama_model *
    facts: ModelFacts
    vocab: Any  # llama_vocab *
    n_vocab: int
    n_threads: int
    flash_attn: bool


class LiveContext:
    """A llama.cpp context with n_seqs streams of ctx_per_seq cells at KV type kv, the samplers that draw from
    its rows, and the batch its steps fill. Closed once, by whoever opened it."""

    def __init__(self, ctx: Any, kv: KVSetting, n_seqs: int, ctx_per_seq: int, attn_rot: tuple[bool, ...],
                 samplers: Samplers, batch_tokens: int) -> None:
        self.ctx = ctx
        self.mem = ll.llama_get_memory(ctx)
        self.kv, self.n_seqs, self.ctx_per_seq = kv, n_seqs, ctx_per_seq
        # whether llama.cpp stores its K and V rotated (engine/kv/convert.py), as its log said
        self.attn_rot = attn_rot
        self.samplers = samplers
        samplers.bind(ctx)
        self.batch = ll.llama_batch_init(batch_tokens, 0, 1)
        self.batch_tokens = batch_tokens
        self.prefill_row: tuple[int, int] | None = None  # (seq, row) of the last prefill's logits
        self._abort_cb: object | None = None  # kept here: llama.cpp holds only the pointer

    def run(self) -> None:
        """llama_decode of the batch as filled; the last prefill's row is gone with it."""
        self.prefill_row = None
        rc = ll.llama_decode(self.ctx, self.batch)
        if rc == 1:
            raise NoKVSlot()
        if rc == 2 and self._abort_cb is not None:
            raise Interrupted()
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def interrupt_with(self, should_stop: Callable[[], bool] | None) -> None:
        """While set, a llama_decode in progress gives up as soon as should_stop() says so (llama.cpp asks
        between graph nodes): a long re-prefill stops at once when the user quits. Costs one Python call
        per node, so it is set only around long steps."""
        if should_stop is None:
            self._abort_cb = None
            ll.llama_set_abort_callback(self.ctx, ll.ggml_abort_callback(), None)
            return
        self._abort_cb = ll.ggml_abort_callback(lambda data: bool(should_stop()))
        ll.llama_set_abort_callback(self.ctx, self._abort_cb, None)

    def close(self, free_samplers: bool) -> None:
        """The context freed (a step launched ahead ends first), then its batch; its samplers after it where
        they were its own (a side cache's), else they stay for the next live context."""
        if self.ctx is None:
            return
        ll.llama_synchronize(self.ctx)
        ll.llama_free(self.ctx)
        self.ctx = self.mem = None
        ll.llama_batch_free(self.batch)
        if free_samplers:
            self.samplers.free()

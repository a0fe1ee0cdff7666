"""The real decode backend: llama.cpp through llama-cpp-python's low-level API.

One llama context, one sequence (its own KV stream: kv_unified off) per agent, so each agent's
attention reads only its own cells, as it would with separate caches.
"""

import ctypes
import os
import platform
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import llama_cpp as ll

from swarmtune.engine.backends.backend import (
    MAX_DRAFT_TOKENS,
    NO_DRAFTS_RECURRENT,
    BackendInfo,
    Caps,
)
from swarmtune.engine.backends.clock import Clock, WallClock
from swarmtune.engine.backends.devices import (
    Device,
    cache_tensor_bytes,
    device_handles,
    free_bytes,
    offload_devices,
    why_cache_does_not_fit,
    why_no_device_sampling,
)
from swarmtune.engine.backends.llama_cells import LlamaCells
from swarmtune.engine.backends.llama_live import LiveContext, ModelHandle
from swarmtune.engine.backends.llama_log import caches_from_log, llama_log_mark, llama_log_since, offloaded_layers
from swarmtune.engine.backends.llama_sampling import Samplers
from swarmtune.engine.backends.llama_scorer import Scorer
from swarmtune.engine.backends.llama_steps import KeptLogits, LlamaSteps, StepWatch
from swarmtune.engine.backends.llama_text import LlamaText
from swarmtune.engine.backends.moe_routing import RoutingCounter
from swarmtune.engine.errors import UserError
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.model.model_facts import ModelFacts

__all__ = ["KeptLogits", "LlamaBackend", "Scorer", "caches_from_log"]


@dataclass(frozen=True)
class Attached:
    """A live context and the parts that act on it: what the backend swaps for a side cache, as one."""

    context: LiveContext
    steps: LlamaSteps
    cells: LlamaCells
    cache_bytes: dict[str, int]  # per cache, from llama.cpp's log when it was made: kv, kv_swa, recurrent
    caps: Caps


class LlamaBackend:
    source = "measured"

    def __init__(self, facts: ModelFacts, n_threads: int | None = None, n_gpu_layers: int = -1,
                 use_extra_bufts: bool = False, flash_attn: bool = True, chunk_tokens: int = 256,
                 measure_routing: bool = False, cpu_only: bool = False, device_sampling: bool = True) -> None:
        """n_gpu_layers: layers offloaded to the build's first device (-1: all); cpu_only keeps the model,
        its cache and every op on the CPU even on a GPU build (the device lane's cross-check).
        use_extra_bufts: llama.cpp's weight repacking (off: it crashes the model load on AMX CPUs).
        measure_routing: count the distinct experts each MoE step routes to (an eval callback: more than 2% of
        step time, bench/moe_routing_cost.py). device_sampling: each row drawn in llama.cpp's graph where it
        can be (off: every row on the host, from its logits)."""
        self.facts = facts
        self.n_threads = n_threads or max(1, os.cpu_count() or 1)
        self.flash_attn = flash_attn
        self.max_chunk_tokens = chunk_tokens
        self.use_extra_bufts = use_extra_bufts
        self._stack = ExitStack()
        mp = ll.llama_model_default_params()
        self._devices = device_handles(cpu_only)  # kept referenced: llama.cpp reads the list at load time
        if self._devices is not None:
            mp.devices = ctypes.cast(self._devices, ctypes.c_void_p)
            n_gpu_layers = 0
        mp.n_gpu_layers = n_gpu_layers
        mp.use_extra_bufts = self.use_extra_bufts
        found = [] if cpu_only or n_gpu_layers == 0 else offload_devices()
        # the device a single-device model's offloaded layers and their cache live on
        self.device: Device | None = found[0] if found else None
        log_mark = llama_log_mark()
        model = ll.llama_model_load_from_file(facts.path.encode(), mp)
        if not model:
            raise UserError(f"llama.cpp could not load {facts.path}")
        self.offloaded_layers = offloaded_layers(llama_log_since(log_mark)) if self.device else 0
        self.model = model
        self._stack.callback(ll.llama_model_free, model)
        self.text = LlamaText(model, facts.architecture)  # the parts, each with one job
        self.vocab, self.n_vocab, self.chat_template = self.text.vocab, self.text.n_vocab, self.text.chat_template
        on_device = device_sampling
        # where the output layer is on a device that cannot view this vocabulary's rows, sampling stays on the host
        why_host = why_no_device_sampling(self.device, self.n_vocab) if self.device and self.offloaded_layers else None
        on_device = on_device and why_host is None
        self.samplers = Samplers(self.vocab, self.n_vocab, self.text.eog_tokens, on_device)
        self._stack.callback(lambda: self.samplers.free())  # after the last context that ran them
        self.routing = RoutingCounter() if measure_routing and facts.bytes_model.is_moe else None
        self.model_handle = ModelHandle(model, facts, self.vocab, self.n_vocab, self.n_threads, flash_attn)
        self.watch = StepWatch(self.routing)
        self.draft_rows = 0  # the drafted tokens a verify step may carry per sequence, in contexts made from now
        self.on: Attached | None = None  # the live context and its parts, once open() made one
        self.kv_buffer_bytes: int | None = None
        self.cache_bytes: dict[str, int] = {}  # per cache, from llama.cpp's log: kv, kv_swa, recurrent
        self._caps_closed = self._caps(None)
        self.info = BackendInfo(
            name="llama.cpp",
            device=self.device.label if self.device else f"CPU {platform.machine()} ({os.cpu_count()} cores)",
            versions={"llama_cpp_python": ll.__version__},
            settings={"n_threads": self.n_threads, "flash_attn": flash_attn, "use_extra_bufts": self.use_extra_bufts,
                      "n_gpu_layers": n_gpu_layers, "offloaded_layers": self.offloaded_layers,
                      "device": self.device.to_dict() if self.device else None,
                      "kv_unified": False, "chat_template": self.chat_template,
                      "swa_full": False, "moe_routing": "measured" if self.routing else "modeled",
                      # where each agent's token is drawn: in llama.cpp's graph, or on the host from its logits
                      "sampling": "device" if on_device else f"host{': ' + why_host if why_host else ''}"},
        )

    # the cache
    def _attach(self, kv: KVSetting, n_seqs: int, ctx_per_seq: int, samplers: Samplers, watch: StepWatch,
                outputs: bool = False) -> Attached:
        """A new context at KV setting kv (a type, or K/V types as "q8_0/f16"), n_seqs streams of ctx_per_seq
        cells, and the parts that act on it: the one way this backend opens a context (the live one, a side
        cache, a scorer). outputs: every row of a batch may ask for its logits (a scorer draws none)."""
        self._refuse_what_the_device_cannot_hold(kv, n_seqs, ctx_per_seq)
        n_batch = max(self.max_chunk_tokens, n_seqs)
        log_mark = llama_log_mark()
        cp = context_params(kv, n_seqs, ctx_per_seq, n_batch, self.n_threads, self.flash_attn, self.routing,
                            0 if outputs else self.draft_rows)
        ctx = ll.llama_init_from_model(self.model, cp)
        if not ctx:
            raise UserError(f"llama.cpp could not create a context with KV type {kv} on this build")
        lines = llama_log_since(log_mark)
        # whether llama.cpp stores this cache's K and V rotated (engine/kv/convert.py), in its own words
        rot = tuple(any(f"attn_rot_{x} = 1" in ln for ln in lines) for x in "kv")
        live = LiveContext(ctx, kv, n_seqs, ctx_per_seq, rot, samplers, max(n_batch, 64))
        caps = self._caps(live)
        return Attached(live, LlamaSteps(self.model_handle, live, watch, self.draft_rows),
                        LlamaCells(self.model_handle, live, caps.shift is None), caches_from_log(lines), caps)

    def _caps(self, live: LiveContext | None) -> Caps:
        """What this model on this build can do, in a context like this one (none yet: as far as is known)."""
        bm = self.facts.bytes_model
        layout = "a sliding-window or recurrent cache (its state is not one K/V cache)" \
            if bm.has_swa or bm.state_bytes else None
        if live is None:
            shift: str | None = "no context is open"
        elif not ll.llama_memory_can_shift(live.mem):
            shift = "this model's positions cannot be shifted (M-RoPE, or a recurrent state)"
        elif layout is None and not (self.flash_attn or live.kv.quantized):
            shift = "V is stored transposed without flash attention"
        else:
            shift = layout
        return Caps(shift=shift, mix=None, drafts=NO_DRAFTS_RECURRENT if bm.state_bytes else None, convert=layout,
                    transposed_v=not self.flash_attn, launches_async=bool(self.device and self.offloaded_layers))

    def _room(self, kv: KVSetting, n_seqs: int, ctx_per_seq: int, freed_bytes: int) -> str | None:
        """None where the cache fits the device; else why not. freed_bytes: what closing a cache first gives
        back. llama.cpp aborts the process where it does not fit, instead of refusing (devices.py)."""
        if self.device is None or self.offloaded_layers == 0:
            return None
        tensor, total = cache_tensor_bytes(self.facts.bytes_model, kv, n_seqs, ctx_per_seq,
                                           max(self.max_chunk_tokens, n_seqs))
        return why_cache_does_not_fit(self.device, tensor, total, free_bytes(self.device) + freed_bytes)

    def why_no_room(self, kv: KVSetting, n_seqs: int, ctx_per_seq: int) -> str | None:
        return self._room(kv, n_seqs, ctx_per_seq, self._live_bytes())

    def _live_bytes(self) -> int:
        return (self.kv_buffer_bytes or 0) if self.on is not None else 0

    def _refuse_what_the_device_cannot_hold(self, kv: KVSetting, n_seqs: int, ctx_per_seq: int,
                                            freed_bytes: int = 0) -> None:
        why = self._room(kv, n_seqs, ctx_per_seq, freed_bytes)
        if why is not None:
            raise UserError(why)

    def open(self, kv: KVSetting, n_seqs: int, ctx_per_seq: int) -> None:
        # asked before the live cache is closed, so that it stays where the new one is refused
        self._refuse_what_the_device_cannot_hold(kv, n_seqs, ctx_per_seq, self._live_bytes())
        self._close_live()
        self.on = self._attach(kv, n_seqs, ctx_per_seq, self.samplers, self.watch)
        self.cache_bytes = self.on.cache_bytes
        self.kv_buffer_bytes = sum(self.cache_bytes.values()) if self.cache_bytes else None

    @contextmanager
    def side_cache(self, kv: KVSetting, n_seqs: int, ctx_per_seq: int) -> Iterator[None]:
        """While held, every call works on another live context of this model (its own cache at KV type kv,
        its own samplers); the live one is back as it was after. A KV type is timed here without
        re-prefilling the swarm."""
        side = self._attach(kv, n_seqs, ctx_per_seq,
                            Samplers(self.vocab, self.n_vocab, self.text.eog_tokens, self.samplers.device_sampling),
                            StepWatch(self.routing))
        live, self.on = self.on, side
        try:
            yield
        finally:
            side.context.close(free_samplers=True)
            self.on = live

    def new_scorer(self, kv: KVSetting, n_ctx: int) -> Scorer:
        """A second context of this model at a KV setting (K/V types apart: "q8_0/f16"), one sequence of n_ctx
        cells, that teacher-forces windows of tokens and gives their logits (engine/quality/kv_quality.py); the
        live cache is not touched. The caller holds it (`with`, or close()): it keeps what it teacher-forced,
        so a window that extends the last one computes only the new tokens."""
        on = self._attach(kv, 1, n_ctx, Samplers(self.vocab, self.n_vocab, self.text.eog_tokens, False),
                          StepWatch(None), outputs=True)
        return Scorer(on.context, self.n_vocab, self.max_chunk_tokens)

    def _close_live(self) -> None:
        if self.on is not None:
            self.on.context.close(free_samplers=False)
            self.on = None

    @property
    def live(self) -> LiveContext:
        assert self.on is not None, "no context: open() first"
        return self.on.context

    @property
    def steps(self) -> LlamaSteps:
        assert self.on is not None, "no context: open() first"
        return self.on.steps

    @property
    def cells(self) -> LlamaCells:
        assert self.on is not None, "no context: open() first"
        return self.on.cells

    @property
    def caps(self) -> Caps:
        return self.on.caps if self.on is not None else self._caps_closed

    @property
    def kv(self) -> KVSetting:
        return self.live.kv

    @property
    def n_seqs(self) -> int:
        return self.on.context.n_seqs if self.on is not None else 0

    @property
    def ctx_per_seq(self) -> int:
        return self.on.context.ctx_per_seq if self.on is not None else 0

    def new_clock(self) -> Clock:
        return WallClock()

    def close(self) -> None:
        self._close_live()
        self._stack.close()

    # what only llama.cpp has: the quality check's kept logits, the MoE counter, the host's sampling time
    def keep_logits(self, seq: int | None, n: int = 0) -> None:
        """From now on keep the logits of seq's last n decode positions (engine/backends/llama_steps.py)."""
        self.steps.keep_logits(seq, n)

    @property
    def host_sampling_s(self) -> float:
        """Seconds the host spent drawing tokens, since the start (bench/host_overhead.py)."""
        return self.samplers.host_s

    def interrupt_with(self, should_stop: Callable[[], bool] | None) -> None:
        self.live.interrupt_with(should_stop)

    def allow_drafts(self, n: int) -> str | None:
        """Contexts made from now on verify up to n drafted tokens a sequence; None, or why not."""
        if n and self.facts.bytes_model.state_bytes:
            return NO_DRAFTS_RECURRENT
        if 0 <= n <= MAX_DRAFT_TOKENS:  # past it the settings refuse the length, and nothing changes
            self.draft_rows = n
        return None


def context_params(kv: KVSetting, n_seqs: int, ctx_per_seq: int, n_batch: int, n_threads: int, flash_attn: bool,
                   routing: RoutingCounter | None, drafts: int = 0) -> Any:
    """llama_context_params for n_seqs streams of ctx_per_seq cells at KV setting kv (a type, or K/V types as
    "q8_0/f16"), each stream its own (kv_unified off)."""
    cp = ll.llama_context_default_params()
    cp.n_seq_max = n_seqs
    cp.n_ctx = n_seqs * ctx_per_seq
    cp.n_batch = n_batch
    cp.n_ubatch = cp.n_batch
    cp.n_threads = n_threads
    cp.n_threads_batch = n_threads
    cp.type_k = kv.k.ggml_type
    cp.type_v = kv.v.ggml_type
    cp.kv_unified = False
    if drafts:
        # a verify step draws a sequence's every drafted row in the graph (backend sampling): llama.cpp's default
        # limit, one output row per sequence, refuses the second (llama_decode returns -1). Set only for
        # speculation: past one row, a seeded chain draws from its transactional generator and penalties leave
        # the device
        cp.n_outputs_max_per_seq = drafts + 1
    # a quantized V cache needs flash attention
    fa_on = flash_attn or kv.quantized
    cp.flash_attn_type = ll.LLAMA_FLASH_ATTN_TYPE_ENABLED if fa_on else ll.LLAMA_FLASH_ATTN_TYPE_DISABLED
    # sliding-window layers keep their window (+ one ubatch), as llama.cpp's own CLI does: memory = what is read
    cp.swa_full = False
    if routing is not None:
        cp.cb_eval = routing.callback
        cp.cb_eval_user_data = None
    return cp

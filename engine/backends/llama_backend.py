"""The real decode backend: llama.cpp through llama-cpp-python's low-level API.

One llama context, one sequence (its own KV stream: kv_unified off) per agent, so each agent's
attention reads only its own cells, as it would with separate caches.
"""

import ctypes
import math
import os
import platform
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import llama_cpp as ll
import numpy as np

from swarmtune.engine.backends.backend import BackendInfo, CacheMismatch, NoKVSlot
from swarmtune.engine.backends.clock import Clock, WallClock
from swarmtune.engine.backends.devices import (
    Device,
    device_handles,
    free_bytes,
    offload_devices,
    why_cache_does_not_fit,
)
from swarmtune.engine.backends.kv_splice import Cells
from swarmtune.engine.backends.moe_routing import RoutingCounter
from swarmtune.engine.conversation.chat_message import ChatMessage
from swarmtune.engine.conversation.chunk_reuse import Chunk
from swarmtune.engine.conversation.sampling import SamplingParams
from swarmtune.engine.errors import Interrupted, UserError
from swarmtune.engine.kv_types import F16, KVSetting
from swarmtune.engine.model.model_facts import ModelFacts

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


def default_measure_routing() -> bool:
    """Count distinct experts per step on MoE models (an eval callback): opt-in (--moe-routing or
    SWARMTUNE_MOE_ROUTING=1), as it costs more than 2% of step time (bench/moe_routing_cost.py)."""
    return os.environ.get("SWARMTUNE_MOE_ROUTING", "0") == "1"


def default_use_extra_bufts() -> bool:
    """Extra buffer types (weight repacking) crash the model load on AMX CPUs; keep them off unless asked."""
    return os.environ.get("SWARMTUNE_EXTRA_BUFTS", "0") == "1"


class LlamaBackend:
    source = "measured"

    def __init__(
        self,
        facts: ModelFacts,
        n_threads: int | None = None,
        n_gpu_layers: int = -1,
        use_extra_bufts: bool | None = None,
        flash_attn: bool = True,
        chunk_tokens: int = 256,
        measure_routing: bool | None = None,
        cpu_only: bool = False,
    ) -> None:
        """n_gpu_layers: layers offloaded to the build's first device (-1: all); cpu_only keeps the model,
        its cache and every op on the CPU even on a GPU build (the device lane's cross-check)."""
        self.facts = facts
        self.n_threads = n_threads or max(1, os.cpu_count() or 1)
        self.flash_attn = flash_attn
        self.max_chunk_tokens = chunk_tokens
        self.use_extra_bufts = default_use_extra_bufts() if use_extra_bufts is None else use_extra_bufts
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
        self.vocab = ll.llama_model_get_vocab(model)
        self.n_vocab = ll.llama_vocab_n_tokens(self.vocab)
        self._full = np.zeros(self.n_vocab, dtype=np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")]))
        self._ids = np.arange(self.n_vocab, dtype=np.int32)
        self._eog: tuple[int, ...] | None = None  # the end-of-generation tokens, found when first wanted
        self.ctx = None
        self.mem = None
        self._ctx_stack = ExitStack()
        self._samplers: dict[int, object] = {}
        self._grammars: dict[int, object] = {}  # seq -> its grammar sampler, where it has one
        self._one = ll.llama_token_data()  # the one candidate a grammar checks (_sample)
        self._one_arr = ll.llama_token_data_array(ctypes.pointer(self._one), 1, -1, False)
        self.batch = ll.llama_batch_init(max(chunk_tokens, 64), 0, 1)
        self._batch_cap = max(chunk_tokens, 64)
        self._stack.callback(lambda: ll.llama_batch_free(self.batch))
        self._piece_buf = ctypes.create_string_buffer(256)
        self._pieces: dict[int, str] = {}
        self._bytes: dict[int, bytes] = {}
        self._template, self.chat_template = self._pick_template(model, facts.architecture)
        self.kv = F16  # the live cache's setting, once open() made one
        self.n_seqs = 0
        self.ctx_per_seq = 0
        self.kv_buffer_bytes: int | None = None
        self.cache_bytes: dict[str, int] = {}  # per cache, from llama.cpp's log: kv, kv_swa, recurrent
        self._prefill_row: tuple[int, int] | None = None  # (seq, row) of the last prefill's logits
        self.host_sampling_s = 0.0  # seconds the host spent drawing tokens from logits, since the start
        # one sequence whose decode logits are kept (the live quality check compares them with a side context)
        self._keep_seq: int | None = None
        self.kept: deque[KeptLogits] = deque()
        self.attn_rot: tuple[bool, ...] = (False, False)
        self._abort_cb: object | None = None  # kept here: llama.cpp holds only the pointer
        # MoE: distinct experts of the last decode step, per MoE layer (measured through an eval callback)
        want_routing = default_measure_routing() if measure_routing is None else measure_routing
        self.routing = RoutingCounter() if want_routing and facts.bytes_model.is_moe else None
        self.last_distinct_experts: list[int] | None = None
        self.info = BackendInfo(
            name="llama.cpp",
            device=self.device.label if self.device else self._cpu(),
            versions={"llama_cpp_python": ll.__version__},
            settings={"n_threads": self.n_threads, "flash_attn": flash_attn, "use_extra_bufts": self.use_extra_bufts,
                      "n_gpu_layers": n_gpu_layers, "offloaded_layers": self.offloaded_layers,
                      "device": self.device.to_dict() if self.device else None,
                      "kv_unified": False, "chat_template": self.chat_template,
                      "swa_full": False, "moe_routing": "measured" if self.routing else "modeled"},
        )

    def _pick_template(self, model: Any, architecture: str) -> tuple[bytes | None, str]:
        """The file's own template; else llama.cpp's built-in one for the model's family; ChatML last.
        Returns (what llama_chat_apply_template takes, or None for ChatML; how the header names it)."""
        own = ll.llama_model_chat_template(model, None)
        if own:
            return own, "the model's own (GGUF tokenizer.chat_template)"
        name = builtin_template_name(architecture, self._has_token)
        if name is not None and _applies(name.encode()):
            return name.encode(), f"llama.cpp built-in {name!r} (the GGUF has no template; family {architecture})"
        return None, f"ChatML (the GGUF has no template and llama.cpp has none for family {architecture})"

    def _has_token(self, text: str) -> bool:
        ids = self.tokenize(text)
        return len(ids) == 1 and self.piece(ids[0]) == text

    @staticmethod
    def _cpu() -> str:
        return f"CPU {platform.machine()} ({os.cpu_count()} cores)"

    # the cache
    def _new_context(self, kv: KVSetting, n_seqs: int, ctx_per_seq: int, outputs: bool = False) -> Any:
        """A llama.cpp context on this model: n_seqs streams of ctx_per_seq cells at KV setting kv (a type,
        or K/V types as "q8_0/f16"). outputs: every row of a batch may ask for its logits (a scorer)."""
        self._refuse_what_the_device_cannot_hold(kv, n_seqs, ctx_per_seq)
        cp = ll.llama_context_default_params()
        cp.n_seq_max = n_seqs
        cp.n_ctx = n_seqs * ctx_per_seq
        cp.n_batch = max(self.max_chunk_tokens, n_seqs)
        cp.n_ubatch = cp.n_batch
        cp.n_threads = self.n_threads
        cp.n_threads_batch = self.n_threads
        cp.type_k = kv.k.ggml_type
        cp.type_v = kv.v.ggml_type
        cp.kv_unified = False
        # a quantized V cache needs flash attention
        fa_on = self.flash_attn or kv.quantized
        cp.flash_attn_type = ll.LLAMA_FLASH_ATTN_TYPE_ENABLED if fa_on else ll.LLAMA_FLASH_ATTN_TYPE_DISABLED
        # sliding-window layers keep their window (+ one ubatch), as llama.cpp's own CLI does: memory = what is read
        cp.swa_full = False
        if self.routing is not None:
            cp.cb_eval = self.routing.callback
            cp.cb_eval_user_data = None
        ctx = ll.llama_init_from_model(self.model, cp)
        if not ctx:
            raise UserError(f"llama.cpp could not create a context with KV type {kv} on this build")
        if outputs:
            return ctx
        if cp.n_batch > self._batch_cap:
            ll.llama_batch_free(self.batch)
            self.batch = ll.llama_batch_init(cp.n_batch, 0, 1)
            self._batch_cap = cp.n_batch
        return ctx

    def _room(self, kv: KVSetting, n_seqs: int, ctx_per_seq: int, freed_bytes: int) -> str | None:
        """None where the cache fits the device; else why not. freed_bytes: what closing a cache first gives
        back. llama.cpp aborts the process where it does not fit, instead of refusing (devices.py)."""
        if self.device is None or self.offloaded_layers == 0:
            return None
        bm = self.facts.bytes_model
        n_batch = max(self.max_chunk_tokens, n_seqs)
        total = sum(bm.llama_cpp_cache_bytes(kv, n_seqs, ctx_per_seq, n_batch).values())
        cells = -(-n_seqs * ctx_per_seq // 256) * 256
        per_layer = max(bm.kv_values_per_layer, default=0)  # K and V values a token adds in one layer
        k_share = bm.k_share
        tensor = int(cells * max(kv.k.bytes_for(per_layer * k_share), kv.v.bytes_for(per_layer * (1 - k_share))))
        return why_cache_does_not_fit(self.device, tensor, total, free_bytes(self.device) + freed_bytes)

    def why_no_room(self, kv: KVSetting, n_seqs: int, ctx_per_seq: int) -> str | None:
        return self._room(kv, n_seqs, ctx_per_seq, self._live_bytes())

    def _live_bytes(self) -> int:
        return (self.kv_buffer_bytes or 0) if self.ctx is not None else 0

    def _refuse_what_the_device_cannot_hold(self, kv: KVSetting, n_seqs: int, ctx_per_seq: int,
                                            freed_bytes: int = 0) -> None:
        why = self._room(kv, n_seqs, ctx_per_seq, freed_bytes)
        if why is not None:
            raise UserError(why)

    def open(self, kv: KVSetting, n_seqs: int, ctx_per_seq: int) -> None:
        # asked before the live cache is closed, so that it stays where the new one is refused
        self._refuse_what_the_device_cannot_hold(kv, n_seqs, ctx_per_seq, self._live_bytes())
        self._close_ctx()
        log_mark = llama_log_mark()
        ctx = self._new_context(kv, n_seqs, ctx_per_seq)
        self.ctx = ctx
        self._ctx_stack.callback(ll.llama_free, ctx)
        self.mem = ll.llama_get_memory(ctx)
        self.kv, self.n_seqs, self.ctx_per_seq = kv, n_seqs, ctx_per_seq
        self._prefill_row = None
        lines = llama_log_since(log_mark)
        self.cache_bytes = caches_from_log(lines)
        # whether llama.cpp stores this cache's K and V rotated (engine/backends/kv_convert.py), in its own words
        self.attn_rot = tuple(any(f"attn_rot_{x} = 1" in ln for ln in lines) for x in "kv")
        self.kv_buffer_bytes = sum(self.cache_bytes.values()) if self.cache_bytes else None

    @contextmanager
    def side_cache(self, kv: KVSetting, n_seqs: int, ctx_per_seq: int) -> Iterator[None]:
        """While held, every call works on a second, temporary context of this model (its own cache at KV
        type kv, its own samplers); the live cache, its samplers and its last prefill row are back as they
        were after. A KV type is timed here without re-prefilling the swarm."""
        live = (self.ctx, self.mem, self.kv, self.n_seqs, self.ctx_per_seq, self._prefill_row, self._samplers,
                self._grammars, self.attn_rot)
        log_mark = llama_log_mark()
        ctx = self._new_context(kv, n_seqs, ctx_per_seq)
        try:
            # the side cache's own rotation (another type may rotate where the live one does not): a state
            # converted for it is checked against this one when restored
            self.attn_rot = tuple(any(f"attn_rot_{x} = 1" in ln for ln in llama_log_since(log_mark)) for x in "kv")
            self.ctx, self.mem = ctx, ll.llama_get_memory(ctx)
            self.kv, self.n_seqs, self.ctx_per_seq, self._prefill_row = kv, n_seqs, ctx_per_seq, None
            self._samplers, self._grammars = {}, {}
            yield
        finally:
            for smpl in [*self._samplers.values(), *self._grammars.values()]:
                ll.llama_sampler_free(smpl)
            ll.llama_free(ctx)
            (self.ctx, self.mem, self.kv, self.n_seqs, self.ctx_per_seq, self._prefill_row, self._samplers,
             self._grammars, self.attn_rot) = live

    @contextmanager
    def scorer(self, kv: KVSetting, n_ctx: int) -> Iterator["Scorer"]:
        """A second context of this model at a KV setting (K/V types apart: "q8_0/f16"), one sequence of
        n_ctx cells, that teacher-forces windows of tokens and gives their logits (engine/quality/kv_quality.py). The
        live cache is not touched."""
        sc = self.new_scorer(kv, n_ctx)
        try:
            yield sc
        finally:
            sc.close()

    def new_scorer(self, kv: KVSetting, n_ctx: int) -> "Scorer":
        """A scorer the caller holds (and closes): it keeps what it teacher-forced, so a window that extends
        the last one computes only the new tokens."""
        return Scorer(self._new_context(kv, 1, n_ctx, outputs=True), self.n_vocab, self.max_chunk_tokens)

    def _close_ctx(self) -> None:
        self._ctx_stack.close()
        self._ctx_stack = ExitStack()
        self.ctx = None

    def new_clock(self) -> Clock:
        return WallClock()

    def close(self) -> None:
        self._close_ctx()
        for smpl in [*self._samplers.values(), *self._grammars.values()]:
            ll.llama_sampler_free(smpl)
        self._samplers.clear()
        self._grammars.clear()
        self._stack.close()

    # text
    def tokenize(self, text: str) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 16
        buf = (ll.llama_token * n_max)()
        n = ll.llama_tokenize(self.vocab, data, len(data), buf, n_max, False, True)
        if n < 0:
            buf = (ll.llama_token * -n)()
            n = ll.llama_tokenize(self.vocab, data, len(data), buf, -n, False, True)
        return list(buf[:n])

    def bos_token(self) -> int | None:
        """The BOS token where this model's vocabulary adds one at a text's start, else None."""
        tok = ll.llama_vocab_bos(self.vocab)
        return tok if tok >= 0 and ll.llama_vocab_get_add_bos(self.vocab) else None

    def piece(self, token: int) -> str:
        p = self._pieces.get(token)
        if p is None:
            p = self._pieces[token] = self.token_bytes(token).decode("utf-8", errors="replace")
        return p

    def check_grammar(self, grammar: str) -> str | None:
        """None where llama.cpp parses this GBNF (any thread: it reads only the vocabulary); else why not."""
        g = ll.llama_sampler_init_grammar(self.vocab, grammar.encode(), b"root")
        if not g:
            return "llama.cpp could not parse the grammar"
        ll.llama_sampler_free(g)
        return None

    @property
    def jinja_template(self) -> str | None:
        """The GGUF's own chat template (Jinja), where it has one."""
        own = ll.llama_model_chat_template(self.model, None)
        return own.decode("utf-8", errors="replace") if own else None

    def special_text(self, which: str) -> str:
        """The text of the BOS or EOS token (what a Jinja template calls bos_token, eos_token)."""
        tok = ll.llama_vocab_bos(self.vocab) if which == "bos" else ll.llama_vocab_eos(self.vocab)
        return self.token_bytes(tok).decode("utf-8", errors="replace") if tok >= 0 else ""

    def token_bytes(self, token: int) -> bytes:
        """A token's own bytes: part of a UTF-8 character, where a character spans tokens."""
        b = self._bytes.get(token)
        if b is None:
            n = ll.llama_token_to_piece(self.vocab, token, self._piece_buf, 256, 0, True)
            b = self._bytes[token] = self._piece_buf.raw[: max(n, 0)]
        return b

    def chat(self, messages: list[ChatMessage], add_assistant: bool) -> str:
        if self._template is None:
            return _chatml(messages, add_assistant)
        arr = (ll.llama_chat_message * len(messages))()
        keep = []
        for i, m in enumerate(messages):
            role, content = m["role"].encode(), m["content"].encode()
            keep += [role, content]
            arr[i].role, arr[i].content = role, content
        size = 4096 + sum(len(m["content"]) * 2 for m in messages)
        buf = ctypes.create_string_buffer(size)
        n = ll.llama_chat_apply_template(self._template, arr, len(messages), add_assistant, buf, size)
        if n < 0:  # a template llama.cpp does not know
            return _chatml(messages, add_assistant)
        if n > size:
            buf = ctypes.create_string_buffer(n + 1)
            n = ll.llama_chat_apply_template(self._template, arr, len(messages), add_assistant, buf, n + 1)
        return buf.raw[:n].decode("utf-8", errors="replace")

    def is_eog(self, token: int) -> bool:
        return bool(ll.llama_vocab_is_eog(self.vocab, token))

    def _eog_tokens(self) -> tuple[int, ...]:
        if self._eog is None:  # once per model: 49k calls, ~20 ms
            self._eog = tuple(t for t in range(self.n_vocab) if ll.llama_vocab_is_eog(self.vocab, t))
        return self._eog

    def seed_sampler(self, seq: int, seed: int) -> None:
        self.set_sampler(seq, SamplingParams(seed=seed))

    def set_sampler(self, seq: int, p: SamplingParams) -> None:
        """seq's own chain, in llama.cpp's common order: penalties, top-k, top-p, min-p, temperature, draw."""
        for held in (self._samplers, self._grammars):
            old = held.pop(seq, None)
            if old is not None:
                ll.llama_sampler_free(old)
        if p.grammar is not None:  # kept apart from the chain: see _sample
            g = ll.llama_sampler_init_grammar(self.vocab, p.grammar.encode(), b"root")
            if not g:
                raise UserError("llama.cpp could not parse the grammar", field="grammar")
            self._grammars[seq] = g
        chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        add = ll.llama_sampler_chain_add
        # as llama-server does it: every end-of-generation token biased to -inf, first; not under a grammar,
        # which may allow nothing but an end once its call is complete (no token could then be drawn)
        if p.ignore_eos and p.grammar is None:
            eog = self._eog_tokens()
            bias = (ll.llama_logit_bias * len(eog))(*(ll.llama_logit_bias(t, -math.inf) for t in eog))
            add(chain, ll.llama_sampler_init_logit_bias(self.n_vocab, len(eog), bias))
        if p.penalised:
            # the pinned llama.cpp takes the vocabulary's size first (its device kernel sizes a count per token)
            add(chain, ll.llama_sampler_init_penalties(self.n_vocab, p.penalty_last_n, 1.0, p.frequency_penalty,
                                                       p.presence_penalty))
        if p.greedy:
            add(chain, ll.llama_sampler_init_greedy())
        else:
            if p.top_k > 0:
                add(chain, ll.llama_sampler_init_top_k(p.top_k))
            if p.top_p < 1.0:
                add(chain, ll.llama_sampler_init_top_p(p.top_p, 1))
            if p.min_p > 0.0:
                add(chain, ll.llama_sampler_init_min_p(p.min_p, 1))
            add(chain, ll.llama_sampler_init_temp(p.temperature))
            add(chain, ll.llama_sampler_init_dist(p.seed & 0xFFFFFFFF))
        self._samplers[seq] = chain

    def _sample(self, seq: int, row: int) -> int:
        """seq's next token from output row `row`. Under a grammar, llama.cpp's common sampler's way: draw
        without it, keep the token if the grammar allows it (one token checked), and only otherwise apply
        the grammar to the whole vocabulary and draw again. Applied to every token first, the grammar cost
        16 ms a token on this CPU (49k candidates); most draws already fit."""
        tok = ll.llama_sampler_sample(self._samplers[seq], self.ctx, row)
        g = self._grammars.get(seq)
        if g is None:
            return int(tok)
        one = self._one
        one.id, one.logit, one.p = tok, 1.0, 0.0
        self._one_arr.size, self._one_arr.selected, self._one_arr.sorted = 1, -1, False
        ll.llama_sampler_apply(g, ctypes.byref(self._one_arr))
        if one.logit != -math.inf:
            ll.llama_sampler_accept(g, tok)
            return int(tok)
        full = self._full
        full["id"] = self._ids
        full["logit"] = np.ctypeslib.as_array(ll.llama_get_logits_ith(self.ctx, row), shape=(self.n_vocab,))
        full["p"] = 0.0
        arr = ll.llama_token_data_array(full.ctypes.data_as(ctypes.POINTER(ll.llama_token_data)), self.n_vocab, -1,
                                        False)
        ll.llama_sampler_apply(g, ctypes.byref(arr))
        ll.llama_sampler_apply(self._samplers[seq], ctypes.byref(arr))
        tok = int(full["id"][arr.selected])
        ll.llama_sampler_accept(g, tok)
        return tok

    # steps
    def prefill(self, seq: int, tokens: list[int], pos0: int) -> float:
        n = len(tokens)
        if not 0 < n <= self._batch_cap:  # past the batch's arrays llama.cpp would read freed memory
            raise ValueError(f"a prefill carries 1..{self._batch_cap} tokens (got {n})")
        b = self.batch
        b.n_tokens = n
        for j, tok in enumerate(tokens):
            b.token[j] = tok
            b.pos[j] = pos0 + j
            b.n_seq_id[j] = 1
            b.seq_id[j][0] = seq
            b.logits[j] = 0
        b.logits[n - 1] = 1  # the last row feeds the first sampled token
        t0 = time.perf_counter()
        self._decode()
        ll.llama_synchronize(self.ctx)
        self._prefill_row = (seq, n - 1)
        return time.perf_counter() - t0

    def decode(self, seqs: list[int], tokens: list[int], positions: list[int]) -> tuple[list[int], float]:
        b = self.batch
        n = len(seqs)
        b.n_tokens = n
        for j in range(n):
            b.token[j] = tokens[j]
            b.pos[j] = positions[j]
            b.n_seq_id[j] = 1
            b.seq_id[j][0] = seqs[j]
            b.logits[j] = 1
        self._prefill_row = None
        sample = ll.llama_sampler_sample
        ctx, samplers = self.ctx, self._samplers
        routing = self.routing
        t0 = time.perf_counter()
        if routing is None:
            self._decode()
        else:
            routing.begin()
            try:
                self._decode()
            finally:
                self.last_distinct_experts = routing.end()
        ll.llama_synchronize(ctx)  # a device's step ends here, not in the first row sampled
        if self._keep_seq is not None and self._keep_seq in seqs:
            j = seqs.index(self._keep_seq)
            row = np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, j), shape=(self.n_vocab,))
            self.kept.append(KeptLogits(positions[j], tokens[j], self.kv, row.copy()))
        t1 = time.perf_counter()
        if self._grammars:
            out = [self._sample(s, j) for j, s in enumerate(seqs)]
        else:
            out = [sample(samplers[s], ctx, j) for j, s in enumerate(seqs)]
        t2 = time.perf_counter()
        self.host_sampling_s += t2 - t1
        return out, t2 - t0

    def keep_logits(self, seq: int | None, n: int = 0) -> None:
        """From now on keep the logits of seq's last n decode positions (a copy of each row, ~200 KB on a 49k
        vocabulary): what the live setting itself produced there. None stops and forgets them."""
        self._keep_seq = seq
        self.kept = deque(maxlen=max(n, 1))

    def first_token_after_prefill(self, seq: int) -> int:
        # Only the last llama_decode's output rows exist; sampling any other aborts the process in C.
        if self._prefill_row is None or self._prefill_row[0] != seq:
            raise RuntimeError(f"no prefill output for sequence {seq} to sample from")
        return self._sample(seq, self._prefill_row[1])

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

    def _decode(self) -> None:
        rc = ll.llama_decode(self.ctx, self.batch)
        if rc == 1:
            raise NoKVSlot()
        if rc == 2 and self._abort_cb is not None:
            raise Interrupted()
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def drop(self, seq: int) -> None:
        ll.llama_memory_seq_rm(self.mem, seq, -1, -1)

    def truncate(self, seq: int, n_tokens: int) -> None:
        ll.llama_memory_seq_rm(self.mem, seq, n_tokens, -1)

    def copy(self, src: int, dst: int) -> None:
        ll.llama_memory_seq_rm(self.mem, dst, -1, -1)
        ll.llama_memory_seq_cp(self.mem, src, dst, -1, -1)

    def why_no_shift(self) -> str | None:
        """None where cached cells can be moved to other positions (chunk reuse); else why not."""
        if self.mem is None or not ll.llama_memory_can_shift(self.mem):
            return "this model's positions cannot be shifted (M-RoPE, or a recurrent state)"
        bm = self.facts.bytes_model
        if bm.has_swa or bm.state_bytes:
            return "a sliding-window or recurrent cache (its state is not one K/V cache)"
        if not (self.flash_attn or self.kv.quantized):
            return "V is stored transposed without flash attention"
        return None

    def cut(self, seq: int, keep: int, chunks: Sequence[Chunk]) -> list[object]:
        """Keep seq's first `keep` cells; each chunk's cells are saved apart first, to be put back at their
        new place by paste() once the tokens before it are prefilled. [] where they cannot be (the caller
        prefills them)."""
        from swarmtune.engine.backends.kv_convert import Unconvertible
        from swarmtune.engine.backends.kv_splice import split

        if not chunks or self.why_no_shift() is not None:
            self.truncate(seq, keep)
            return []
        _, hi = self.cells(seq)
        # a chunk that moves up is first moved up with the rest, past every position it will move through,
        # so that paste() puts it above the new tokens and only ever shifts it down
        up = max(0, max(c.shift for c in chunks))
        try:
            if up:
                ll.llama_memory_seq_add(self.mem, seq, keep, -1, up)
                self._apply_shift(seq, hi + up + 1)
            saved, _, _ = self.save_seq(seq)
            assert isinstance(saved, _SavedSeq)
            cells = split(memoryview(saved.data), self.facts.n_layer)
        except (NoKVSlot, Unconvertible):
            self.truncate(seq, keep)
            return []
        self.truncate(seq, keep)
        return [_Kept(cells.between(c.held_at + up, c.held_at + up + c.tokens), c.held_at + up, c.tokens, self.kv)
                for c in chunks]

    def _apply_shift(self, seq: int, pos: int) -> None:
        """llama.cpp re-rotates shifted K at the start of a decode: one token at pos, then removed."""
        b = self.batch
        b.n_tokens = 1
        b.token[0], b.pos[0], b.n_seq_id[0], b.seq_id[0][0], b.logits[0] = 0, pos, 1, seq, 0
        self._prefill_row = None
        try:
            self._decode()
        finally:
            ll.llama_memory_seq_rm(self.mem, seq, pos, -1)

    def paste(self, seq: int, kept: object, at: int) -> float:
        """Put a chunk cut() saved back at position `at`, right after seq's last cell; returns seconds.
        NoKVSlot (seq is then empty) where the cache has no room; CacheMismatch where the chunk is another
        cache type's."""
        from swarmtune.engine.backends.kv_splice import join, split

        assert isinstance(kept, _Kept)
        if kept.kv != self.kv:
            raise CacheMismatch(f"sequence {seq}: a chunk cut at KV {kept.kv} pasted into a {self.kv} cache")
        t0 = time.perf_counter()
        if self.cells(seq) == (-1, -1):
            base = kept.cells.between(0, 0)
        else:
            saved, _, _ = self.save_seq(seq)
            assert isinstance(saved, _SavedSeq)
            base = split(memoryview(saved.data), self.facts.n_layer)
        state = join(base, kept.cells)
        buf = (ctypes.c_uint8 * len(state)).from_buffer(state)
        if ll.llama_state_seq_set_data(self.ctx, buf, len(state), seq) == 0:
            raise NoKVSlot()
        if at != kept.pos:
            ll.llama_memory_seq_add(self.mem, seq, kept.pos, kept.pos + kept.tokens, at - kept.pos)
            # applied now, not at the next decode: a state saved before it (the next chunk's paste, a KV
            # switch's conversion) would carry the new positions with K still rotated for the old ones
            self._apply_shift(seq, at + kept.tokens)
        return time.perf_counter() - t0

    def save_seq(self, seq: int) -> tuple[object, int, float]:
        """llama.cpp's own per-sequence state (its cells' K and V rows, a recurrent state), copied to host."""
        t0 = time.perf_counter()
        n = ll.llama_state_seq_get_size(self.ctx, seq)
        buf = (ctypes.c_uint8 * n)()
        written = ll.llama_state_seq_get_data(self.ctx, buf, n, seq)
        if written != n:
            raise RuntimeError(f"llama_state_seq_get_data wrote {written} of {n} bytes for sequence {seq}")
        return _SavedSeq(buf, n, self.kv), n, time.perf_counter() - t0

    def restore_seq(self, seq: int, handle: object) -> float:
        assert isinstance(handle, _SavedSeq)
        if handle.kv != self.kv:  # the rows are in the old cache's type: llama.cpp would read them wrong
            raise CacheMismatch(f"sequence {seq}: a state saved at KV {handle.kv} restored into a {self.kv} cache")
        if handle.rot is not None and handle.rot != self.attn_rot:
            from swarmtune.engine.backends.kv_convert import Unconvertible

            raise Unconvertible(f"converted for rotation {handle.rot}, but this cache rotates {self.attn_rot}")
        t0 = time.perf_counter()
        read = ll.llama_state_seq_set_data(self.ctx, handle.data, handle.nbytes, seq)
        if read == 0:  # llama.cpp found no room for the cells (and left the sequence empty)
            raise NoKVSlot()
        return time.perf_counter() - t0

    def can_convert(self, kv_from: KVSetting, kv_to: KVSetting) -> str | None:
        bm = self.facts.bytes_model
        if bm.has_swa or bm.state_bytes:
            return "a sliding-window or recurrent cache (its state is not one K/V cache)"
        if not all(self.flash_attn or k.quantized for k in (kv_from, kv_to)):
            return "V is stored transposed without flash attention"
        return None

    def convert_saved(self, handle: object, kv: KVSetting) -> tuple[object, float]:
        from swarmtune.engine.backends.kv_convert import Unconvertible, convert, rotation

        assert isinstance(handle, _SavedSeq)
        t0 = time.perf_counter()
        f = self.facts
        rot_from, rot_to = (rotation(k, f.head_dim_k, f.head_dim_v) for k in (handle.kv, kv))
        if handle.kv == self.kv and tuple(bool(r) for r in rot_from) != self.attn_rot:
            raise Unconvertible(f"llama.cpp rotates this {self.kv} cache as {self.attn_rot}, not as expected")
        data = convert(memoryview(handle.data), f.n_layer, kv, self.n_threads, rot_from, rot_to)
        buf = (ctypes.c_uint8 * len(data)).from_buffer(data)
        return _SavedSeq(buf, len(data), kv, tuple(bool(r) for r in rot_to)), time.perf_counter() - t0

    def cells(self, seq: int) -> tuple[int, int]:
        return ll.llama_memory_seq_pos_min(self.mem, seq), ll.llama_memory_seq_pos_max(self.mem, seq)

    def next_logits(self, seq: int, token: int, pos: int) -> np.ndarray:
        """The logits that follow `token` at `pos` in seq, as this cache computes them; the cache is left
        as it was. A check that a cache still holds its agent's text (tests, --check diagnostics)."""
        b = self.batch
        b.n_tokens = 1
        b.token[0], b.pos[0], b.n_seq_id[0], b.seq_id[0][0], b.logits[0] = token, pos, 1, seq, 1
        self._prefill_row = None
        self._decode()
        row = ll.llama_get_logits_ith(self.ctx, 0)
        out = np.ctypeslib.as_array(row, shape=(self.n_vocab,)).copy()
        ll.llama_memory_seq_rm(self.mem, seq, pos, -1)
        return out


class Scorer:
    """One sequence in its own context: a window of tokens in, the logits of its positions from `first` on
    out (a row per position, float32), teacher-forced, as llama-perplexity computes them."""

    def __init__(self, ctx: Any, n_vocab: int, n_batch: int) -> None:
        self.ctx, self.n_vocab, self.n_batch = ctx, n_vocab, n_batch
        self.mem = ll.llama_get_memory(ctx)
        self.n_ctx = ll.llama_n_ctx(ctx)
        self.held: list[int] = []  # the tokens its cache holds, positions 0..
        self.computed = 0  # tokens the last window computed (those it reused not counted)

    def close(self) -> None:
        if self.ctx is not None:
            ll.llama_free(self.ctx)
            self.ctx = None

    def reusable(self, tokens: list[int], first: int) -> int:
        """How many of a window's first tokens its cache already holds and need not be computed again: the
        common prefix with what it holds, short of `first` (the rows wanted are computed, never kept)."""
        n = min(len(self.held), first)
        if self.held[:n] == tokens[:n]:  # the usual case (a history that grew), compared in C
            return n
        lo, hi = 0, n  # else the longest common prefix, by bisection on prefix equality
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.held[:mid] == tokens[:mid]:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def logits(self, tokens: list[int], first: int, at: Sequence[int] | None = None) -> np.ndarray:
        """Rows for positions first.. of the window, or, given `at` (positions, ascending), for those only."""
        if not 0 <= first < len(tokens):
            raise ValueError(f"first position {first} outside a window of {len(tokens)} tokens")
        wanted_at: set[int] | None = None
        if at is not None:
            wanted_at = set(at)
            if len(wanted_at) != len(at) or list(at) != sorted(at) or not all(first <= p < len(tokens) for p in at):
                raise ValueError("positions to score must ascend, once each, within the window from `first`")
        if len(tokens) > self.n_ctx:
            raise ValueError(f"a window of {len(tokens)} tokens is past this scorer's {self.n_ctx} cells")
        reuse = self.reusable(tokens, first)
        if len(tokens) - reuse < MIN_CHUNK_ROWS:  # computed again, so that no chunk is short (below)
            reuse = max(0, len(tokens) - MIN_CHUNK_ROWS)
        ll.llama_memory_seq_rm(self.mem, 0, reuse, -1)
        self.held = self.held[:reuse]
        self.computed = len(tokens) - reuse
        rows = len(tokens) - first if wanted_at is None else len(wanted_at)
        out = np.empty((rows, self.n_vocab), dtype=np.float32)
        batch = ll.llama_batch_init(self.n_batch, 0, 1)
        try:
            row = 0
            for start, end in scoring_chunks(reuse, len(tokens), self.n_batch):
                chunk = tokens[start:end]
                batch.n_tokens = len(chunk)
                wanted = 0
                for j, tok in enumerate(chunk):
                    pos = start + j
                    batch.token[j], batch.pos[j], batch.n_seq_id[j] = tok, pos, 1
                    batch.seq_id[j][0] = 0
                    keep = pos >= first if wanted_at is None else pos in wanted_at
                    batch.logits[j] = 1 if keep else 0
                    wanted += keep
                rc = ll.llama_decode(self.ctx, batch)
                if rc != 0:
                    self.held = []
                    ll.llama_memory_clear(self.mem, True)
                    raise RuntimeError(f"llama_decode returned {rc} in a scoring context")
                self.held.extend(chunk)
                if wanted:
                    got = np.ctypeslib.as_array(ll.llama_get_logits(self.ctx), shape=(wanted, self.n_vocab))
                    out[row:row + wanted] = got
                    row += wanted
            return out
        finally:
            ll.llama_batch_free(batch)


# llama.cpp's CPU flash attention computes an f16 cache's rows in f32 tiles of 64 query rows (GGML_FA_TILE_Q)
# where a chunk has that many, and row by row with the query rounded to f16 where it has fewer: the two differ
# by ~0.003 nats on the default model, as much as q8_0 costs. A reference is computed in chunks of at least
# this many rows (as llama-perplexity's 512-token windows are), however much of it a scorer reuses.
MIN_CHUNK_ROWS = 64


def scoring_chunks(lo: int, hi: int, n_batch: int) -> list[tuple[int, int]]:
    """[lo, hi) in chunks of at most n_batch rows and, where there are MIN_CHUNK_ROWS, none fewer: a short
    tail takes rows from the chunk before it."""
    bounds = [[s, min(s + n_batch, hi)] for s in range(lo, hi, n_batch)]
    if len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] < MIN_CHUNK_ROWS:
        short = MIN_CHUNK_ROWS - (bounds[-1][1] - bounds[-1][0])
        bounds[-2][1] -= short
        bounds[-1][0] -= short
    return [(a, b) for a, b in bounds]


@dataclass(frozen=True)
class KeptLogits:
    """One decode position's logits as the live cache produced them (LlamaBackend.keep_logits)."""

    pos: int  # the position of the token fed; the row predicts the token at pos + 1
    token: int  # the token fed there
    kv: KVSetting  # the live cache's setting when it was computed
    logits: np.ndarray  # float32, one per vocabulary entry


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


# llama.cpp's built-in chat templates by name (llama-chat.cpp), for a model family whose GGUF carries none.
_FAMILY_TEMPLATES = {
    "gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma", "gemma3n": "gemma",
    "phi3": "phi3", "phimoe": "phi3", "phi4": "phi4",
    "qwen2": "chatml", "qwen2moe": "chatml", "qwen3": "chatml", "qwen3moe": "chatml", "qwen3next": "chatml",
    "deepseek": "deepseek", "deepseek2": "deepseek3",
    "command-r": "command-r", "cohere2": "command-r",
    "chatglm": "chatglm4", "glm4": "chatglm4", "glm4moe": "chatglm4",
    "granite": "granite", "granitemoe": "granite", "granitehybrid": "granite",
    "exaone": "exaone3", "exaone4": "exaone4", "minicpm": "minicpm", "openai-moe": "gpt-oss", "gpt-oss": "gpt-oss",
    "rwkv6": "rwkv-world", "rwkv7": "rwkv-world", "bailingmoe": "bailing", "hunyuan-moe": "hunyuan-moe",
    "smolvlm": "smolvlm", "falcon-h1": "falcon3", "mistral3": "mistral-v7", "llama4": "llama4",
}


def builtin_template_name(architecture: str, has_token: Callable[[str], bool]) -> str | None:
    """The name of llama.cpp's built-in template for this family. The `llama` architecture covers
    Llama 2, Llama 3 and Mistral, told apart by their special tokens."""
    if architecture == "llama":
        if has_token("<|start_header_id|>"):
            return "llama3"
        if has_token("[INST]"):
            return "mistral-v1"
        return None
    return _FAMILY_TEMPLATES.get(architecture)


def _applies(template: bytes) -> bool:
    """llama.cpp knows this template (an unknown one makes llama_chat_apply_template return -1)."""
    msg = (ll.llama_chat_message * 1)()
    msg[0].role, msg[0].content = b"user", b"hi"
    buf = ctypes.create_string_buffer(256)
    return bool(ll.llama_chat_apply_template(template, msg, 1, True, buf, 256) >= 0)


def _chatml(messages: list[ChatMessage], add_assistant: bool) -> str:
    s = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return s + ("<|im_start|>assistant\n" if add_assistant else "")

"""Each sequence's sampler: its chain (and grammar), where it runs, and the draw from a step's output rows.

A chain runs inside the live context's graph where llama.cpp can run it (backend sampling: every sampler
swarmtune builds has a device kernel) and only its token comes back; the host reads that token and accepts
it into the chain. A chain under a grammar, or one whose raw logits the quality check keeps, is drawn on
the host from its row's logits, as llama.cpp's own server does. Where the device cannot view a row of
this vocabulary, the backend turns device sampling off (devices.py why_no_device_sampling).
"""

import ctypes
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import llama_cpp as ll
import numpy as np

from swarmtune.engine.backends.lazy_trigger import LazyTrigger
from swarmtune.engine.conversation.sampling import SamplingParams
from swarmtune.engine.errors import UserError


class Samplers:
    def __init__(self, vocab: Any, n_vocab: int, eog_tokens: Callable[[], tuple[int, ...]],
                 device_sampling: bool) -> None:
        self.vocab, self.n_vocab = vocab, n_vocab
        self._eog_tokens = eog_tokens
        self.device_sampling = device_sampling
        self.ctx: Any = None  # the context whose rows it draws from, and whose graph runs its chains
        self.chains: dict[int, Any] = {}
        self.grammars: dict[int, Any] = {}  # seq -> its grammar sampler, where it has one
        self.lazy: dict[int, LazyTrigger] = {}  # seq -> where its lazy grammar's trigger fires (lazy_trigger.py)
        self.on_device: set[int] = set()  # seqs whose chain the context runs in its graph
        # chains llama.cpp has set up for a graph: from then on they are its alone (applied on the host they
        # skip their device samplers; set up twice, they abort), so one that moves is cloned, state and all
        self._bound: set[int] = set()
        self.penalised_seqs: set[int] = set()  # seqs whose chain has penalties
        self.keep_seq: int | None = None  # its raw logits wanted (the quality check): drawn on the host
        self.host_s = 0.0  # seconds the host spent drawing tokens, since the start
        self._one = ll.llama_token_data()  # the one candidate a grammar checks (draw)
        self._one_arr = ll.llama_token_data_array(ctypes.pointer(self._one), 1, -1, False)
        self._full: np.ndarray | None = None  # the whole vocabulary as candidates, made when a grammar first needs it

    def bind(self, ctx: Any) -> None:
        """A new context: every chain runs in its graph where it can."""
        self.ctx = ctx
        self.on_device = set()  # the old context, and what it held, is gone
        for seq in list(self.chains):
            self._fresh(seq)
            self._attach(seq)

    def set(self, seq: int, p: SamplingParams) -> None:
        """seq's own chain, in llama.cpp's common order: penalties, top-k, top-p, min-p, temperature, draw."""
        if seq in self.on_device and self.ctx is not None:
            ll.llama_set_sampler(self.ctx, seq, None)
        self.on_device.discard(seq)
        self._bound.discard(seq)
        for held in (self.chains, self.grammars):
            old = held.pop(seq, None)
            if old is not None:
                ll.llama_sampler_free(old)
        self.lazy.pop(seq, None)
        if p.grammar is not None:  # kept apart from the chain: see draw
            g = _grammar(self.vocab, p.grammar, p.grammar_triggers)
            if not g:
                raise UserError("llama.cpp could not parse the grammar", field="grammar")
            self.grammars[seq] = g
            if p.grammar_triggers:
                self.lazy[seq] = LazyTrigger(self.vocab, p.grammar, p.grammar_triggers)
        chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        add = ll.llama_sampler_chain_add
        # as llama-server does it: every end-of-generation token biased to -inf, first; not under a grammar,
        # which may allow nothing but an end once its call is complete (no token could then be drawn)
        if p.ignore_eos and p.grammar is None:
            eog = self._eog_tokens()
            bias = (ll.llama_logit_bias * len(eog))(*(ll.llama_logit_bias(t, -math.inf) for t in eog))
            add(chain, ll.llama_sampler_init_logit_bias(self.n_vocab, len(eog), bias))
        self.penalised_seqs.discard(seq)
        if p.penalised:
            self.penalised_seqs.add(seq)
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
        self.chains[seq] = chain
        self._attach(seq)

    def keep(self, seq: int | None) -> None:
        """seq's raw logits come back from the device from now on (its row drawn on the host); None: nobody's."""
        old, self.keep_seq = self.keep_seq, seq
        if seq is not None:
            self._detach(seq)
        if old is not None and old != seq and old in self.chains:
            self._attach(old)

    def _attach(self, seq: int) -> None:
        if (self.ctx is None or not self.device_sampling or seq in self.grammars or seq == self.keep_seq
                or seq in self.on_device):
            return
        self._fresh(seq)
        self._bound.add(seq)  # set up by llama.cpp even where it then declines it
        if ll.llama_set_sampler(self.ctx, seq, self.chains[seq]):
            self.on_device.add(seq)

    def _detach(self, seq: int) -> None:
        if seq in self.on_device and self.ctx is not None:
            ll.llama_set_sampler(self.ctx, seq, None)
        self.on_device.discard(seq)
        self._fresh(seq)  # drawn on the host from now on

    def _fresh(self, seq: int) -> None:
        """seq's chain as one no graph has set up: a clone (its draws so far and its penalties' history kept)
        in place of one that was."""
        if seq not in self._bound or seq in self.on_device:
            return
        old = self.chains[seq]
        self.chains[seq] = ll.llama_sampler_clone(old)
        ll.llama_sampler_free(old)
        self._bound.discard(seq)

    @contextmanager
    def raw(self, seq: int) -> Iterator[None]:
        """While held, seq's rows come back as logits (a position scored, not drawn)."""
        was = seq in self.on_device
        self._detach(seq)
        try:
            yield
        finally:
            if was:
                self._attach(seq)

    def grammar_allows(self, seq: int, tokens: Sequence[int]) -> int:
        """How many of `tokens`, from the start, seq's grammar lets follow what it has accepted (all, without one):
        checked on a copy of its grammar, one token at a time, as `draw` checks a drawn token."""
        g = self.grammars.get(seq)
        if g is None or not tokens:
            return len(tokens)
        t0 = time.perf_counter()
        probe = ll.llama_sampler_clone(g)
        lazy = self.lazy[seq].copy() if seq in self.lazy else None
        one, arr = self._one, self._one_arr
        n = 0
        try:
            for tok in tokens:
                one.id, one.logit, one.p = ll.llama_token(tok), 1.0, 0.0
                arr.size, arr.selected, arr.sorted = 1, -1, False
                ll.llama_sampler_apply(probe, ctypes.byref(arr))
                if one.logit == -math.inf or (lazy is not None and not lazy.allows(tok)):
                    break
                ll.llama_sampler_accept(probe, tok)
                if lazy is not None:
                    lazy.accepted(tok)
                n += 1
        finally:
            ll.llama_sampler_free(probe)
        self.host_s += time.perf_counter() - t0
        return n

    def on_host(self, seqs: Sequence[int]) -> list[int]:
        """Of these sequences, those whose tokens the host draws from their logits."""
        return [s for s in seqs if s not in self.on_device]

    def draw_rows(self, seqs: Sequence[int]) -> list[int]:
        """The next token of each sequence, row j being seqs[j]'s (a decode step's outputs)."""
        t0 = time.perf_counter()
        if self.grammars:
            out = [self.draw(s, j) for j, s in enumerate(seqs)]
        else:
            # a token the device drew is read and accepted here: llama_sampler_sample would do the same after
            # four lookups and a debug line through the log callback, a Python call per row
            ctx, chains, on_device = self.ctx, self.chains, self.on_device
            sample, token, accept = ll.llama_sampler_sample, ll.llama_get_sampled_token_ith, ll.llama_sampler_accept
            out = []
            for j, s in enumerate(seqs):
                if s in on_device:
                    tok = token(ctx, j)
                    if tok >= 0:
                        accept(chains[s], tok)
                        out.append(tok)
                        continue
                out.append(sample(chains[s], ctx, j))
        self.host_s += time.perf_counter() - t0
        return out

    def verify(self, seqs: Sequence[int], starts: Sequence[int], drafts: Sequence[Sequence[int]]) -> list[list[int]]:
        """Per sequence, the tokens a verify step keeps: its draws row by row from starts[j], for as long as each
        draw is the draft there, and the draw that ended the run. A draft that is the draw it stands for is
        kept with the draw's own probability, so the output is distributed as without drafts; under greedy
        sampling it is the same text. On the host each row is drawn after the last was accepted into the chain
        (penalties and grammars see the tokens before it); the device draws every row from the chain as the
        step began, so a penalised chain is drafted only on the host (engine/batch_runner.py)."""
        t0 = time.perf_counter()
        out = []
        for s, j0, d in zip(seqs, starts, drafts, strict=True):
            kept: list[int] = []
            for i in range(len(d) + 1):
                if s in self.on_device and (tok := ll.llama_get_sampled_token_ith(self.ctx, j0 + i)) >= 0:
                    ll.llama_sampler_accept(self.chains[s], tok)
                else:
                    tok = self.draw(s, j0 + i)
                kept.append(int(tok))
                if i == len(d) or tok != d[i]:
                    break
            out.append(kept)
        self.host_s += time.perf_counter() - t0
        return out

    def penalised(self, seq: int) -> bool:
        """Its chain keeps a history of tokens (penalties): the device would draw every drafted row without
        the drafts before it."""
        return seq in self.penalised_seqs

    def draw(self, seq: int, row: int) -> int:
        """seq's next token from output row `row`. Under a grammar, llama.cpp's common sampler's way: draw
        without it, keep the token if the grammar allows it (one token checked), and only otherwise apply
        the grammar to the whole vocabulary and draw again. Applied to every token first, the grammar cost
        16 ms a token on this CPU (49k candidates); most draws already fit."""
        tok = ll.llama_sampler_sample(self.chains[seq], self.ctx, row)
        g = self.grammars.get(seq)
        if g is None:
            return int(tok)
        one = self._one
        one.id, one.logit, one.p = tok, 1.0, 0.0
        self._one_arr.size, self._one_arr.selected, self._one_arr.sorted = 1, -1, False
        ll.llama_sampler_apply(g, ctypes.byref(self._one_arr))
        lazy = self.lazy.get(seq)
        if one.logit != -math.inf and (lazy is None or lazy.allows(tok)):
            return self._accept(seq, g, int(tok))
        if self._full is None:
            self._full = np.zeros(self.n_vocab, dtype=np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")]))
        full = self._full
        full["id"] = np.arange(self.n_vocab, dtype=np.int32)
        full["logit"] = np.ctypeslib.as_array(ll.llama_get_logits_ith(self.ctx, row), shape=(self.n_vocab,))
        full["p"] = 0.0
        arr = ll.llama_token_data_array(full.ctypes.data_as(ctypes.POINTER(ll.llama_token_data)), self.n_vocab, -1,
                                        False)
        ll.llama_sampler_apply(g, ctypes.byref(arr))
        ll.llama_sampler_apply(self.chains[seq], ctypes.byref(arr))
        tok = int(full["id"][arr.selected])
        if lazy is not None and not lazy.allows(tok):
            tok = self._safe_fallback(seq, g, lazy, row)
        return self._accept(seq, g, tok)

    def _accept(self, seq: int, g: Any, tok: int) -> int:
        ll.llama_sampler_accept(g, tok)
        if (lazy := self.lazy.get(seq)) is not None:
            lazy.accepted(tok)
        return tok

    def _safe_fallback(self, seq: int, g: Any, lazy: LazyTrigger, row: int) -> int:
        """The likeliest token the grammar allows and the trigger's watch too (rare: the draw completed a
        trigger with text the call's grammar refuses)."""
        logits = np.ctypeslib.as_array(ll.llama_get_logits_ith(self.ctx, row), shape=(self.n_vocab,))
        one = self._one
        for tok in np.argsort(-logits)[:4096]:
            one.id, one.logit, one.p = ll.llama_token(int(tok)), 1.0, 0.0
            self._one_arr.size, self._one_arr.selected, self._one_arr.sorted = 1, -1, False
            ll.llama_sampler_apply(g, ctypes.byref(self._one_arr))
            if one.logit != -math.inf and lazy.allows(int(tok)):
                return int(tok)
        return int(next(iter(self._eog_tokens())))  # nothing near the top fits: the reply ends here

    def free(self) -> None:
        """Every chain and grammar freed (after the context that ran them)."""
        for smpl in [*self.chains.values(), *self.grammars.values()]:
            ll.llama_sampler_free(smpl)
        self.chains.clear()
        self.grammars.clear()
        self.lazy.clear()
        self.on_device.clear()
        self._bound.clear()


def _grammar(vocab: Any, grammar: str, triggers: tuple[str, ...]) -> Any:
    """A grammar sampler: from the first token, or (lazy) from where a trigger pattern first matches the text."""
    if not triggers:
        return ll.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    patterns = (ctypes.c_char_p * len(triggers))(*(t.encode() for t in triggers))
    return ll.llama_sampler_init_grammar_lazy_patterns(vocab, grammar.encode(), b"root", patterns, len(triggers),
                                                       None, 0)

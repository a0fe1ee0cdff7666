"""Drafts from a second, smaller model that shares the target's vocabulary (llama-server's --model-draft):
where the agents' own text has nothing to copy, a small model of the same family often guesses what the
large one will write. Behind the same interface as the n-gram drafter (engine/spec/drafts.py asks either).

Each agent's history lives in its own sequence of the draft model's cache (one cache for all, cells shared).
Before a step it is brought level with the agent's (what changed since it was drafted is removed, what is
new decoded: every agent's in the same calls), then one batched call per drafted token, greedy, as llama.cpp
drafts: an agent stops where the draft model's top token is less likely than P_MIN, or at an end of
generation. Its seconds are the step's
(Drafts.spent_s): the draft model runs on the same device, between the target's steps."""

import os
import time
from collections.abc import Callable
from typing import Any

import llama_cpp as ll
import numpy as np

from swarmtune.engine.agents.agent import Agent
from swarmtune.engine.errors import UserError
from swarmtune.engine.spec.draft_model_limits import DRAFT_CALL_TOKENS, P_MIN


def vocab_mismatch(target: Any, draft: Any) -> str | None:
    """None where the two vocabularies give every token the same text (a draft's ids mean the target's); else
    why not, in a few words."""
    n_t, n_d = ll.llama_vocab_n_tokens(target), ll.llama_vocab_n_tokens(draft)
    if n_t != n_d:
        return f"its vocabulary has {n_d:,} tokens, the model's {n_t:,}: a draft model must share the model's"
    for tok in range(n_t):
        if ll.llama_vocab_get_text(target, tok) != ll.llama_vocab_get_text(draft, tok):
            return f"token {tok} is {ll.llama_vocab_get_text(draft, tok)!r} in it and " \
                   f"{ll.llama_vocab_get_text(target, tok)!r} in the model: a draft model must share the vocabulary"
    return None


class ModelDrafter:
    """Owns the draft model, its cache and, per sequence, the tokens its cells hold."""

    def __init__(self, path: str, target_vocab: Any, n_threads: int, on_device: bool,
                 room: Callable[[Any, int], str | None] | None = None) -> None:
        """room: where the draft model runs on a device, why a cache of that many cells for this model would
        not fit it (None: it fits); llama.cpp aborts the process on Vulkan where it does not (devices.py)."""
        if not os.path.isfile(path):
            raise UserError(f"--draft-model {path}: no such file", field="draft_model")
        mp = ll.llama_model_default_params()
        mp.n_gpu_layers = -1 if on_device else 0
        mp.use_extra_bufts = False  # they crash AMX CPUs, as the target's (llama_backend.py)
        model = ll.llama_model_load_from_file(path.encode(), mp)
        if not model:
            raise UserError(f"--draft-model: llama.cpp could not load {path}", field="draft_model")
        self.model = model
        self.vocab = ll.llama_model_get_vocab(model)
        why = vocab_mismatch(target_vocab, self.vocab)
        if why is not None:
            ll.llama_model_free(model)
            raise UserError(f"--draft-model {path}: {why}", field="draft_model")
        self.path = path
        self.n_vocab = ll.llama_vocab_n_tokens(self.vocab)
        self.n_threads = n_threads
        self.ctx: Any = None
        self.mem: Any = None
        self.n_seqs, self.n_cells = 0, 0
        # per sequence: the tokens in its cells, in order, and the agent, its edit count and its history's
        # length when they were last brought level (no edit since: only what was drafted past that can differ)
        self.held: dict[int, list[int]] = {}
        self.level: dict[int, tuple[int, int, int]] = {}
        self.batch = ll.llama_batch_init(DRAFT_CALL_TOKENS, 0, 1)
        self.room = room
        self.call_rows = DRAFT_CALL_TOKENS
        self.why_off: str | None = None  # why it drafts nothing from now on (its cache refused, a failed call)
        # the last draft's calls past the first (one a drafted token, the batch's agents in each) and their
        # seconds: what a drafted token costs, apart from bringing the cache level (a catch-up of any size)
        self.rounds, self.round_s = 0, 0.0

    def close(self) -> None:
        if self.ctx is not None:
            ll.llama_free(self.ctx)
            self.ctx = None
        ll.llama_batch_free(self.batch)
        ll.llama_model_free(self.model)

    def _ensure(self, n_seqs: int, n_cells: int) -> None:
        """A cache for at least n_seqs sequences and n_cells cells (the target's shape): made again, empty,
        where the live one is smaller."""
        if self.ctx is not None and n_seqs <= self.n_seqs and n_cells <= self.n_cells:
            return
        if self.ctx is not None:
            ll.llama_free(self.ctx)
            self.ctx = self.mem = None
        self.held.clear()
        self.level.clear()
        if self.room is not None and (why := self.room(self.model, n_cells)) is not None:
            raise _Off(why)
        cp = ll.llama_context_default_params()
        cp.n_seq_max, cp.n_ctx = n_seqs, n_cells
        cp.n_batch = cp.n_ubatch = DRAFT_CALL_TOKENS
        cp.n_threads = cp.n_threads_batch = self.n_threads
        cp.kv_unified = True  # one pool of cells: short histories leave room for long ones
        ctx = ll.llama_init_from_model(self.model, cp)
        if not ctx:
            raise _Off(f"llama.cpp could not make a draft cache of {n_cells:,} cells")
        self.ctx, self.mem = ctx, ll.llama_get_memory(ctx)
        self.n_seqs, self.n_cells = n_seqs, n_cells
        self.call_rows = min(DRAFT_CALL_TOKENS, ll.llama_n_batch(ctx))

    def draft_many(self, agents: list[Agent], rooms: list[int], n_seqs: int, n_cells: int) -> list[list[int]]:
        """Each agent's draft, at most its room ([] where its room is 0): the draft model's greedy guesses past
        its history and its next token. n_seqs, n_cells: the target's cache shape (the draft's follows)."""
        out: list[list[int]] = [[] for _ in agents]
        if self.why_off is not None:
            return out
        try:
            return self._draft(agents, rooms, n_seqs, n_cells, out)
        except _Off as off:  # no traceback mid-run: the swarm goes on without drafts, and says why
            self.why_off = str(off)
            return [[] for _ in agents]

    def _draft(self, agents: list[Agent], rooms: list[int], n_seqs: int, n_cells: int,
               out: list[list[int]]) -> list[list[int]]:
        live = [i for i, (a, r) in enumerate(zip(agents, rooms, strict=True)) if r > 0 and a.next_token is not None]
        if not live:
            return out
        self._ensure(max(n_seqs, 1 + max(agents[i].seq for i in live)), n_cells)
        # each agent's history and its next token: where the draft goes on from (not copied: a step's host work)
        ends = {i: len(agents[i].history) + 1 for i in live}
        feeds = [(agents[i].seq, self._bring_level(agents[i])) for i in live]
        try:
            firsts = self._decode_feeds(feeds)
            cur = {i: self._take(out[i], firsts[k]) for k, i in enumerate(live)}
            self.round_s, self.rounds, t0 = 0.0, 0, time.perf_counter()
            while True:  # one call per drafted token, every agent still drafting in it
                go = [i for i in live if cur[i] is not None and len(out[i]) < rooms[i]]
                if not go:
                    break
                rows = [(agents[i].seq, out[i][-1], ends[i] + len(out[i]) - 1) for i in go]
                got = self._decode_rows(rows)
                self.rounds += 1
                for i, tok in zip(go, got, strict=True):
                    self.held[agents[i].seq].append(out[i][-1])
                    cur[i] = self._take(out[i], tok)
            self.round_s = time.perf_counter() - t0
        except _NoRoom:  # the draft's cache is full: it starts empty, and this step drafts nothing
            ll.llama_memory_clear(self.mem, True)
            self.held.clear()
            self.level.clear()
            return [[] for _ in agents]
        return out

    def _take(self, draft: list[int], tok: int | None) -> int | None:
        """tok drafted (None: too unsure, nothing); what the next call decodes after it (None: an end of
        generation, drafted, and nothing past it)."""
        if tok is None:
            return None
        draft.append(tok)
        return None if ll.llama_vocab_is_eog(self.vocab, tok) else tok

    def _bring_level(self, a: Agent) -> tuple[int, list[int]]:
        """Removes the cells of a's sequence past what it shares with a's history; returns (position, tokens to
        decode): the history past that, then its next token (whose logits give the first draft)."""
        hist = a.history
        held = self.held.setdefault(a.seq, [])
        who, edits, upto = self.level.get(a.seq, (-1, -1, 0))
        # the same agent (not one made since with its id and sequence), no edit since it was last level: its
        # first `upto` tokens are still the agent's, only the drafts past them can differ
        p = min(upto, len(held), len(hist)) if (who, edits) == (a.made, a.edits) else 0
        n = min(len(held), len(hist))
        while p < n and held[p] == hist[p]:
            p += 1
        if p < len(held) and not ll.llama_memory_seq_rm(self.mem, a.seq, p, -1):
            # a state that cannot be cut (a recurrent draft model): drop it whole and decode all again
            ll.llama_memory_seq_rm(self.mem, a.seq, -1, -1)
            p = 0
        del held[p:]
        self.level[a.seq] = (a.made, a.edits, len(hist))
        return p, [*hist[p:], a.next_token or 0]  # next_token: not None for an agent asked to draft

    def _decode_feeds(self, feeds: list[tuple[int, tuple[int, list[int]]]]) -> list[int | None]:
        """Decodes each sequence's tokens from its position, in calls of at most DRAFT_CALL_TOKENS rows; each
        sequence's first draft (None: too unsure), from its last row's logits."""
        rows = [(seq, tok, pos + j, j == len(toks) - 1) for seq, (pos, toks) in feeds for j, tok in enumerate(toks)]
        firsts: dict[int, int | None] = {}
        for c in range(0, len(rows), self.call_rows):
            call = rows[c:c + self.call_rows]
            self._call([(s, t, p) for s, t, p, _ in call], [last for *_, last in call])
            for j, (seq, _, _, last) in enumerate(call):
                if last:
                    firsts[seq] = self._guess(j)
            for seq, tok, _, _ in call:
                self.held[seq].append(tok)
        return [firsts[seq] for seq, _ in feeds]

    def _decode_rows(self, rows: list[tuple[int, int, int]]) -> list[int | None]:
        self._call(rows, [True] * len(rows))
        return [self._guess(j) for j in range(len(rows))]

    def _call(self, rows: list[tuple[int, int, int]], logits: list[bool]) -> None:
        b = self.batch
        b.n_tokens = len(rows)
        for j, ((seq, tok, pos), want) in enumerate(zip(rows, logits, strict=True)):
            b.token[j], b.pos[j], b.n_seq_id[j], b.logits[j] = tok, pos, 1, int(want)
            b.seq_id[j][0] = seq
        ret = ll.llama_decode(self.ctx, b)
        if ret == 1:
            raise _NoRoom
        if ret != 0:
            raise _Off(f"llama_decode returned {ret} on the draft model")

    def _guess(self, row: int) -> int | None:
        """The draft model's top token at a row, where it is at least P_MIN likely; else None."""
        v = np.ctypeslib.as_array(ll.llama_get_logits_ith(self.ctx, row), shape=(self.n_vocab,))
        tok = int(v.argmax())
        p_top = 1.0 / float(np.exp(v - v[tok]).sum())
        return tok if p_top >= P_MIN else None


class _NoRoom(Exception):
    """The draft model's cache has no cells for a call (llama_decode returned 1)."""


class _Off(Exception):
    """The draft model cannot go on (its cache refused, a call failed): why, in one line."""

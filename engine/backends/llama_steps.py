"""The steps the live context runs: a prefill chunk of one sequence, a decode row per sequence, one position
teacher-forced for its logits; the batch they fill, and what a step leaves behind (its prefill row, the
logits the quality check keeps, the experts an MoE step routed to)."""

import time
from collections import deque
from dataclasses import dataclass, field

import llama_cpp as ll
import numpy as np

from swarmtune.engine.backends.backend import Landing, VerifyLanding
from swarmtune.engine.backends.llama_live import LiveContext, ModelHandle
from swarmtune.engine.backends.moe_routing import RoutingCounter
from swarmtune.engine.conversation.sampling import SamplingParams
from swarmtune.engine.kv.types import KVSetting


@dataclass(frozen=True)
class KeptLogits:
    """One decode position's logits as the live cache produced them (LlamaBackend.keep_logits)."""

    pos: int  # the position of the token fed; the row predicts the token at pos + 1
    token: int  # the token fed there
    kv: KVSetting  # the live cache's setting when it was computed
    logits: np.ndarray  # float32, one per vocabulary entry


@dataclass
class StepWatch:
    """What the steps leave for others to read, across every live context a backend opens: the logits the
    quality check keeps, and the experts an MoE step routed to."""

    routing: RoutingCounter | None
    # one sequence whose decode logits are kept (the live quality check compares them with a side context)
    keep_seq: int | None = None
    kept: deque[KeptLogits] = field(default_factory=deque)
    last_distinct_experts: list[int] | None = None


class LlamaSteps:
    """The steps one live context runs, drawn through its samplers."""

    def __init__(self, model: ModelHandle, live: LiveContext, watch: StepWatch, draft_rows: int) -> None:
        self.m, self.live, self.watch = model, live, watch
        self.batch, self.batch_cap = live.batch, live.batch_tokens
        self.drafts = draft_rows  # the drafted tokens a verify step may carry per sequence (the context's room)

    def seed_sampler(self, seq: int, seed: int) -> None:
        self.live.samplers.set(seq, SamplingParams(seed=seed))

    def set_sampler(self, seq: int, p: SamplingParams) -> None:
        self.live.samplers.set(seq, p)

    def prefill(self, seq: int, tokens: list[int], pos0: int) -> float:
        n = len(tokens)
        if not 0 < n <= self.batch_cap:  # past the batch's arrays llama.cpp would read freed memory
            raise ValueError(f"a prefill carries 1..{self.batch_cap} tokens (got {n})")
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
        self.live.run()
        ll.llama_synchronize(self.live.ctx)
        self.live.prefill_row = (seq, n - 1)
        return time.perf_counter() - t0

    def launch_decode(self, seqs: list[int], tokens: list[int], positions: list[int]) -> Landing:
        """The batch filled and llama_decode called: on a GPU it returns once the graph is queued, on the CPU
        once it is computed. What it returns waits for the device and reads the step's tokens."""
        b = self.batch
        n = len(seqs)
        b.n_tokens = n
        for j in range(n):
            b.token[j] = tokens[j]
            b.pos[j] = positions[j]
            b.n_seq_id[j] = 1
            b.seq_id[j][0] = seqs[j]
            b.logits[j] = 1
        routing = self.watch.routing
        t0 = time.perf_counter()
        if routing is None:
            self.live.run()
        else:
            routing.begin()
            try:
                self.live.run()
            finally:
                self.watch.last_distinct_experts = routing.end()
        launched_s = time.perf_counter() - t0
        return lambda: self._land(seqs, tokens, positions, t0, launched_s)

    def launch_mixed(self, seqs: list[int], tokens: list[int], positions: list[int], prefill_seq: int,
                     prefill_tokens: list[int], pos0: int) -> Landing:
        """launch_decode with one sequence's prefill chunk in the same llama_decode (llama-server's way): the
        decode rows first, each drawn at the landing, then the chunk's, its last row kept for
        first_token_after_prefill as a prefill's is."""
        b = self.batch
        n, m = len(seqs), len(prefill_tokens)
        if not 0 < m <= self.batch_cap - n:
            raise ValueError(f"a mixed step carries 1..{self.batch_cap - n} prefill tokens (got {m})")
        b.n_tokens = n + m
        rows = [(tokens[j], positions[j], seqs[j], 1) for j in range(n)]
        rows += [(t, pos0 + i, prefill_seq, int(i == m - 1)) for i, t in enumerate(prefill_tokens)]
        for j, (tok, pos, seq, out) in enumerate(rows):
            b.token[j], b.pos[j], b.n_seq_id[j], b.seq_id[j][0], b.logits[j] = tok, pos, 1, seq, out
        t0 = time.perf_counter()
        self.live.run()
        self.watch.last_distinct_experts = None
        self.live.prefill_row = (prefill_seq, n + m - 1)
        launched_s = time.perf_counter() - t0
        return lambda: self._land(seqs, tokens, positions, t0, launched_s)

    def launch_verify(self, seqs: list[int], tokens: list[int], positions: list[int],
                      drafts: list[list[int]]) -> VerifyLanding:
        """A decode step whose sequences may carry drafted tokens after the one they were fed: row by row, each
        sequence's token then its drafts at the positions after it, every row's output drawn. What it returns
        waits for the device and gives, per sequence, the tokens it keeps: the drafts its own draws agreed with,
        then the draw after them (engine/backends/llama_sampling.py verify). A sequence's drafts its grammar
        would reject are cut from its list first (in place: the caller counts what was verified): no row is
        spent on a token whose draw the grammar could never make it."""
        for s, d in zip(seqs, drafts, strict=True):
            if d and s in self.live.samplers.grammars:
                # the draft follows the token fed, which the grammar has accepted when it was drawn
                del d[self.live.samplers.grammar_allows(s, d):]
        b = self.batch
        n = len(seqs) + sum(len(d) for d in drafts)
        if n > self.batch_cap:
            raise ValueError(f"a verify step carries at most {self.batch_cap} rows (got {n})")
        b.n_tokens = n
        starts = []
        j = 0
        for s, tok, pos, d in zip(seqs, tokens, positions, drafts, strict=True):
            starts.append(j)
            for i, t in enumerate((tok, *d)):
                b.token[j] = t
                b.pos[j] = pos + i
                b.n_seq_id[j] = 1
                b.seq_id[j][0] = s
                b.logits[j] = 1
                j += 1
        t0 = time.perf_counter()
        self.live.run()
        self.watch.last_distinct_experts = None
        launched_s = time.perf_counter() - t0

        def landed() -> tuple[list[list[int]], float]:
            t_wait = time.perf_counter()
            ll.llama_synchronize(self.live.ctx)
            if self.watch.keep_seq is not None and self.watch.keep_seq in seqs:
                k = seqs.index(self.watch.keep_seq)
                row = np.ctypeslib.as_array(ll.llama_get_logits_ith(self.live.ctx, starts[k]), shape=(self.m.n_vocab,))
                self.watch.kept.append(KeptLogits(positions[k], tokens[k], self.live.kv, row.copy()))
            out = self.live.samplers.verify(seqs, starts, drafts)
            at_once = t_wait - t0 - launched_s < 1e-4
            return out, (launched_s + time.perf_counter() - t_wait) if at_once else time.perf_counter() - t0
        return landed

    def why_no_drafts(self, seq: int) -> str | None:
        if not self.drafts:
            return "the context has no room for drafted rows (allow_drafts)"
        if self.live.samplers.penalised(seq) and seq in self.live.samplers.on_device:
            return "a penalised chain drawn on the device would not see the drafts before each row"
        return None

    def _land(self, seqs: list[int], tokens: list[int], positions: list[int], t0: float,
              launched_s: float) -> tuple[list[int], float]:
        t_wait = time.perf_counter()
        ctx = self.live.ctx
        ll.llama_synchronize(ctx)  # a device's step ends here, not in the first row sampled
        if self.watch.keep_seq is not None and self.watch.keep_seq in seqs:
            j = seqs.index(self.watch.keep_seq)
            row = np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, j), shape=(self.m.n_vocab,))
            self.watch.kept.append(KeptLogits(positions[j], tokens[j], self.live.kv, row.copy()))
        out = self.live.samplers.draw_rows(seqs)
        # waited for at once: the step's own seconds. Landed after other work: from its launch, the device's
        # step where the wait shows the device was still at it, an upper bound where the host was slower
        waited_at_once = t_wait - t0 - launched_s < 1e-4
        return out, (launched_s + time.perf_counter() - t_wait) if waited_at_once else time.perf_counter() - t0

    def keep_logits(self, seq: int | None, n: int = 0) -> None:
        """From now on keep the logits of seq's last n decode positions (a copy of each row, ~200 KB on a 49k
        vocabulary): what the live setting itself produced there. None stops and forgets them."""
        self.watch.keep_seq = seq
        self.watch.kept = deque(maxlen=max(n, 1))
        self.live.samplers.keep(seq)  # its raw logits come back from the device

    def first_token_after_prefill(self, seq: int) -> int:
        # Only the last llama_decode's output rows exist; sampling any other aborts the process in C.
        if self.live.prefill_row is None or self.live.prefill_row[0] != seq:
            raise RuntimeError(f"no prefill output for sequence {seq} to sample from")
        return self.live.samplers.draw(seq, self.live.prefill_row[1])

    def next_logits(self, seq: int, token: int, pos: int) -> np.ndarray:
        """The logits that follow `token` at `pos` in seq, as this cache computes them; the cache is left
        as it was. A check that a cache still holds its agent's text (tests, --check diagnostics)."""
        b = self.batch
        b.n_tokens = 1
        b.token[0], b.pos[0], b.n_seq_id[0], b.seq_id[0][0], b.logits[0] = token, pos, 1, seq, 1
        with self.live.samplers.raw(seq):  # its row's logits, not a token drawn on the device
            self.live.run()
            row = ll.llama_get_logits_ith(self.live.ctx, 0)
            out = np.ctypeslib.as_array(row, shape=(self.m.n_vocab,)).copy()
        ll.llama_memory_seq_rm(self.live.mem, seq, pos, -1)
        return out

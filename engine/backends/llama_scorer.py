"""Teacher-forced logits of one sequence in a context of its own, as llama-perplexity computes them: what the
KV quality figures compare (engine/quality/kv_quality.py)."""

from collections.abc import Sequence

import llama_cpp as ll
import numpy as np

from swarmtune.engine.backends.llama_live import LiveContext


class Scorer:
    """One sequence in its own context: a window of tokens in, the logits of its positions from `first` on
    out (a row per position, float32), teacher-forced, as llama-perplexity computes them."""

    def __init__(self, live: LiveContext, n_vocab: int, n_batch: int) -> None:
        self.live, self.n_vocab, self.n_batch = live, n_vocab, min(n_batch, live.batch_tokens)
        self.ctx, self.mem = live.ctx, live.mem
        self.n_ctx = ll.llama_n_ctx(live.ctx)
        self.held: list[int] = []  # the tokens its cache holds, positions 0..
        self.computed = 0  # tokens the last window computed (those it reused not counted)

    def close(self) -> None:
        self.live.close(free_samplers=True)

    def __enter__(self) -> "Scorer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        batch = self.live.batch
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

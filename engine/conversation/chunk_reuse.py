"""Which of a conversation's cached cells a new prompt can keep past the first token it changed: runs of
the old history that reappear later in the prompt, shifted by what was inserted or removed before them.

llama-server's `--cache-reuse N` walks the old cells from the divergence and keeps a run of at least N of
them that matches the prompt where the prompt stands; it never skips the prompt's own new tokens, so it
keeps what follows a removal and nothing after an insertion or a replaced value (a timestamp in the system
header). This plan skips either side: for each prompt position after the divergence it looks for the old
history's continuation there, so a header value that changed costs its own few tokens and the rest of the
history is shifted into place. Chunks keep their order (positions only move, cells are never reordered),
none moves up past more than MAX_INSERTED new tokens, and the prompt's last token is always prefilled:
the next token is sampled from its row.

A kept chunk is an approximation: its cells attended to the old text before it. docs/serving.md gives
its measured cost (next-token KL against a full prefill, bench/cache_reuse.py)."""

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from swarmtune.engine.conversation.token_hashes import TokenHashes

DEFAULT_MIN_TOKENS = 64  # --cache-reuse's default; docs/serving.md says how it was chosen
MAX_CANDIDATES = 32
# a chunk that would move up past more new tokens than this is prefilled instead: its cells never attended
# them. Measured (bench/cache_reuse.py, default model): chunks past a changed header value (a few tokens)
# cost a mean next-token KL of 0.002 nats against a full prefill; a reminder moved past a whole new exchange
# (~200 tokens) cost 0.044 nats, and its worst position 0.41
MAX_INSERTED = 32
SEED_TOKENS = 8  # runs are found from an index of this many tokens (fewer where the minimum is lower)


@dataclass(frozen=True)
class Chunk:
    held_at: int  # its first position in the old history
    prompt_at: int  # its first position in the new prompt
    tokens: int

    @property
    def shift(self) -> int:
        return self.prompt_at - self.held_at


@dataclass(frozen=True)
class KeptChunk:
    """A chunk cut from an agent's cells, to be put back once its history reaches `at`."""

    at: int  # where it goes in the new history
    tokens: tuple[int, ...]
    handle: object  # the backend's saved cells


def unfold(history_len: int, pending: Sequence[int], kept: Sequence[KeptChunk]) -> list[int]:
    """pending with the kept chunks' tokens in their places: what is prefilled where they cannot be put back."""
    out: list[int] = []
    at = history_len
    i = 0
    for k in kept:
        take = k.at - at
        out += pending[i : i + take]
        i += take
        out += k.tokens
        at = k.at + len(k.tokens)
    return out + list(pending[i:])


def seed_tokens(min_tokens: int) -> int:
    """The n-gram runs of at least min_tokens are found from (0: none are looked for)."""
    return max(1, min(SEED_TOKENS, min_tokens)) if min_tokens > 0 else 0


def plan(held: Sequence[int], prompt: Sequence[int], keep: int, min_tokens: int) -> list[Chunk]:
    """The chunks of held[keep:] to keep in prompt[keep:], in order, each at least min_tokens long; [] when
    min_tokens is 0 (off) or nothing reappears."""
    if min_tokens <= 0:
        return []
    end = len(prompt) - 1  # the last token is prefilled
    seed = seed_tokens(min_tokens)
    if end - keep < min_tokens or len(held) - keep < seed:
        return []
    # the runs are found from their seeds (n-grams), hashed: every seed of held after keep, sorted, and
    # which prompt positions' seeds are among them at all (the others are passed over in one step)
    held_seeds = TokenHashes(held[keep:]).seeds(seed)
    prompt_seeds = TokenHashes(prompt[keep : end - min_tokens + seed]).seeds(seed)
    order = np.argsort(held_seeds, kind="stable")  # a seed's places stay in their order
    by_seed = held_seeds[order]
    seen = np.flatnonzero(np.isin(prompt_seeds, held_seeds)).tolist()
    chunks: list[Chunk] = []
    hc, hp = keep, keep  # the old history is used from hc, the prompt is placed from hp
    while hp + min_tokens <= end:
        at = bisect_left(seen, hp - keep)
        if at == len(seen):
            break
        hp = keep + seen[at]
        if hp + min_tokens > end:
            break
        x = prompt_seeds[hp - keep]
        found = (order[np.searchsorted(by_seed, x) : np.searchsorted(by_seed, x, side="right")] + keep).tolist()
        best_at, best_n = -1, 0
        # a repetitive text seeds many runs: the first few after hc are enough to find a long one
        for i in [i for i in found if i >= hc and hp - i <= MAX_INSERTED][:MAX_CANDIDATES]:
            if held[i : i + seed] != prompt[hp : hp + seed]:
                continue  # two seeds with one hash
            n = _run(held, i, prompt, hp, seed, end)
            if n > best_n:
                best_at, best_n = i, n
        if best_n >= min_tokens:
            chunks.append(Chunk(best_at, hp, best_n))
            hc, hp = best_at + best_n, hp + best_n
        else:
            hp += 1
    return chunks


def _run(held: Sequence[int], i: int, prompt: Sequence[int], hp: int, n: int, end: int) -> int:
    """How far held from i and prompt from hp agree (they do for their first n), short of the prompt's end:
    compared a slice at a time, then token by token."""
    most = min(end - hp, len(held) - i)
    step = 256
    while n + step <= most and held[i + n : i + n + step] == prompt[hp + n : hp + n + step]:
        n += step
    while n < most and held[i + n] == prompt[hp + n]:
        n += 1
    return n

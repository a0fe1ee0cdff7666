"""Token lists compared by hashes: prefix hashes grown a piece at a time are the whole list's, a seed hashes
the same wherever it stands, window minima are the least of each window, a shared run shares an anchor; and
the chunk plan found from hashed seeds is the token walk it replaced, on random, repetitive, edited texts."""

import random

import numpy as np
import pytest

from swarmtune.engine.conversation import chunk_reuse
from swarmtune.engine.conversation.token_hashes import TokenHashes, common_prefix, shared_prefix, window_min


def _reference_plan(held: list[int], prompt: list[int], keep: int, min_tokens: int) -> list[chunk_reuse.Chunk]:
    """chunk_reuse.plan as it was written first: a dict of seed tuples, a walk over every prompt position."""
    if min_tokens <= 0:
        return []
    end = len(prompt) - 1  # the last token is prefilled
    seed = max(1, min(chunk_reuse.SEED_TOKENS, min_tokens))
    index: dict[tuple[int, ...], list[int]] = {}
    for i in range(keep, len(held) - seed + 1):
        index.setdefault(tuple(held[i : i + seed]), []).append(i)
    chunks: list[chunk_reuse.Chunk] = []
    hc, hp = keep, keep  # the old history is used from hc, the prompt is placed from hp
    while hp + min_tokens <= end:
        best_at, best_n = -1, 0
        # a repetitive text seeds many runs: the first few after hc are enough to find a long one
        found = index.get(tuple(prompt[hp : hp + seed]), ())
        for i in [i for i in found if i >= hc and hp - i <= chunk_reuse.MAX_INSERTED][:chunk_reuse.MAX_CANDIDATES]:
            n = seed
            while hp + n < end and i + n < len(held) and held[i + n] == prompt[hp + n]:
                n += 1
            if n > best_n:
                best_at, best_n = i, n
        if best_n >= min_tokens:
            chunks.append(chunk_reuse.Chunk(best_at, hp, best_n))
            hc, hp = best_at + best_n, hp + best_n
        else:
            hp += 1
    return chunks


@pytest.mark.parametrize("min_tokens", [1, 8, 16, 64])
def test_the_hashed_chunk_plan_is_the_walk_it_replaces(min_tokens):
    rng = random.Random(min_tokens)
    for _ in range(300):
        vocab = rng.choice([2, 4, 30, 10_000])
        held = [rng.randrange(vocab) for _ in range(rng.randrange(0, 400))]
        prompt = list(held)
        for _edit in range(rng.randrange(0, 4)):  # cuts, insertions, repeats
            at = rng.randrange(len(prompt) + 1)
            if rng.random() < 0.5:
                prompt = prompt[:at] + prompt[at + rng.randrange(1, 60):]
            else:
                prompt = prompt[:at] + [rng.randrange(vocab) for _ in range(rng.randrange(1, 40))] + prompt[at:]
        keep = common_prefix(held, prompt) if rng.random() < 0.8 else rng.randrange(min(len(held), len(prompt)) + 1)
        assert chunk_reuse.plan(held, prompt, keep, min_tokens) == _reference_plan(held, prompt, keep, min_tokens)


def test_hashes_grown_a_piece_at_a_time_are_the_whole_lists():
    rng = random.Random(1)
    t = [rng.randrange(100) for _ in range(3000)]
    whole, grown = TokenHashes(t), TokenHashes()
    at = 0
    while at < len(t):
        n = rng.randrange(1, 400)
        grown.extend(t[at : at + n])
        at += n
    assert (whole.prefix[: whole.n + 1] == grown.prefix[: grown.n + 1]).all()
    edited = t[:1234] + [999] + t[1235:]
    assert shared_prefix(whole, TokenHashes(edited)) == 1234
    # a seed hashes the same wherever it stands
    moved = TokenHashes([7, 7, 7] + t[:100])
    assert (whole.seeds(8, 0, 100) == moved.seeds(8, 3, 103)).all()


def test_window_minima_are_the_least_of_each_window():
    rng = random.Random(2)
    v = np.array([rng.randrange(1 << 62) for _ in range(500)], dtype=np.uint64)
    for w in (1, 2, 7, 57, 500):
        assert window_min(v, w).tolist() == [min(v[i : i + w].tolist()) for i in range(len(v) - w + 1)]
    assert len(window_min(v, 501)) == 0


def test_a_run_shares_an_anchor_wherever_each_list_holds_it():
    rng = random.Random(3)
    seed = chunk_reuse.seed_tokens(64)
    window = 64 - seed + 1
    run = [rng.randrange(1000) for _ in range(64)]
    a = TokenHashes([rng.randrange(1000) for _ in range(37)] + run)
    b = TokenHashes(run + [rng.randrange(1000) for _ in range(90)])
    assert set(window_min(a.seeds(seed), window).tolist()) & set(window_min(b.seeds(seed), window).tolist())

"""Hashes of a token list that let two lists be compared without walking them: a prefix hash at every
length (two lists whose hashes at m agree share their first m tokens, but for a 64-bit collision), and the
anchors of its runs: of every window of consecutive seeds (n-grams), the least seed hash (winnowing, as
MOSS finds copied code). Two lists that share a run of at least `seed + window - 1` tokens, wherever each
holds it, share an anchor: the windows inside the run are the same in both, and so are their least hashes.

All arithmetic is numpy's uint64, which wraps: a polynomial hash modulo 2**64 over mixed tokens."""

from collections.abc import Sequence

import numpy as np

_P = np.uint64(0x9E3779B97F4A7C15)  # odd: invertible modulo 2**64
_P_INV = np.uint64(pow(0x9E3779B97F4A7C15, -1, 1 << 64))
_MIX = np.uint64(0xFF51AFD7ED558CCD)
_SHIFT = np.uint64(33)
_TOP = np.iinfo(np.uint64).max
HEADROOM_TOKENS = 1024


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many first items a and b share: compared a slice at a time (in C), the slices narrowing where
    they stop agreeing."""
    n = min(len(a), len(b))
    i = 0
    for step in (256, 32, 4, 1):
        while i + step <= n and a[i : i + step] == b[i : i + step]:
            i += step
    return i


class _Powers:
    """P**j and P**-j modulo 2**64 for j < n, grown on demand (shared by every list)."""

    def __init__(self) -> None:
        self.up: np.ndarray = np.ones(1, dtype=np.uint64)
        self.down: np.ndarray = np.ones(1, dtype=np.uint64)

    def at_least(self, n: int) -> None:
        if n <= len(self.up):
            return
        n = max(n, 2 * len(self.up))
        with np.errstate(over="ignore"):
            self.up = np.cumprod(np.concatenate(([np.uint64(1)], np.full(n - 1, _P, dtype=np.uint64))))
            self.down = np.cumprod(np.concatenate(([np.uint64(1)], np.full(n - 1, _P_INV, dtype=np.uint64))))


POWERS = _Powers()


def _mixed(tokens: Sequence[int]) -> np.ndarray:
    # arrays wrap silently (numpy warns of overflow on scalars only)
    x = np.array(tokens, dtype=np.uint64)
    x *= _MIX
    x ^= x >> _SHIFT
    x *= _MIX
    return x


def window_min(values: np.ndarray, window: int) -> np.ndarray:
    """The least of each `window` consecutive values (van Herk / Gil-Werman: three passes, any window)."""
    n = len(values)
    if n < window:
        return np.empty(0, dtype=values.dtype)
    if window == 1:
        return values.copy()
    blocks = -(-n // window)
    padded = np.full(blocks * window, _TOP, dtype=np.uint64)
    padded[:n] = values
    grid = padded.reshape(blocks, window)
    ahead = np.minimum.accumulate(grid, axis=1).ravel()  # from each block's start
    behind = np.minimum.accumulate(grid[:, ::-1], axis=1)[:, ::-1].ravel()  # to each block's end
    starts = np.arange(n - window + 1)
    return np.minimum(behind[starts], ahead[starts + window - 1])


def _segments(lengths: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Where each of these consecutive segments starts in their concatenation, and each one's length."""
    k = np.array(lengths, dtype=np.int64)
    return np.cumsum(k) - k, k


def extend_all(lists: "Sequence[TokenHashes]", tokens: Sequence[Sequence[int]]) -> None:
    """Each list extended by its tokens, all in one pass of numpy calls (a step's worth of appends over a
    swarm costs what one agent's would, not one agent's times the agents)."""
    grow = [(h, t) for h, t in zip(lists, tokens, strict=True) if len(t)]
    if not grow:
        return
    ns = [h.n for h, _ in grow]
    ks = [len(t) for _, t in grow]
    POWERS.at_least(max(n + k for n, k in zip(ns, ks, strict=True)) + 1)
    flat: list[int] = []
    for _, t in grow:
        flat.extend(t)
    starts, k_arr = _segments(ks)
    n_arr = np.array(ns, dtype=np.int64)
    at = np.arange(len(flat)) + np.repeat(n_arr - starts, k_arr)  # each token's position in its own list
    sums = np.cumsum(_mixed(flat) * POWERS.up[at])
    before = np.concatenate((np.zeros(1, dtype=np.uint64), sums[:-1]))[starts]  # the sum before each segment
    base = np.array([h.prefix[h.n] for h, _ in grow], dtype=np.uint64)
    values = sums + np.repeat(base - before, k_arr)
    for (h, _), n, k, s in zip(grow, ns, ks, starts.tolist(), strict=True):
        h.room(n + k)
        h.prefix[n + 1 : n + k + 1] = values[s : s + k]
        h.n = n + k


def seed_windows(lists: "Sequence[TokenHashes]", starts: Sequence[int], seed: int, window: int) -> list[np.ndarray]:
    """For each list, the least seed hash of each window of `window` seeds, for the windows from that
    list's start to the last its tokens hold: in one pass over every list."""
    spans = []  # (list, first window, windows)
    for h, w0 in zip(lists, starts, strict=True):
        windows = h.n - seed - window + 2
        spans.append((h, w0, max(0, windows - w0)))
    live = [(i, h, w0, w) for i, (h, w0, w) in enumerate(spans) if w > 0]
    out = [np.empty(0, dtype=np.uint64)] * len(spans)
    if not live:
        return out
    # each list's prefix hashes from its first window's first seed to its end: seeds and windows are made
    # over the concatenation and only those that lie inside one list are kept
    pieces = [h.prefix[w0 : h.n + 1] for _, h, w0, _ in live]
    lengths = [len(x) for x in pieces]
    flat = np.concatenate(pieces)
    offsets, len_arr = _segments(lengths)
    at = np.arange(len(flat) - seed) + np.repeat(np.array([w0 for _, _, w0, _ in live]) - offsets, len_arr)[:-seed]
    seeds = (flat[seed:] - flat[:-seed]) * POWERS.down[np.maximum(at, 0)]
    mins = window_min(seeds, window)
    for (i, _, _, w), off in zip(live, offsets.tolist(), strict=True):
        out[i] = mins[off : off + w]
    return out


class TokenHashes:
    """One token list's prefix hashes, appended to as the list grows."""

    def __init__(self, tokens: Sequence[int] = ()) -> None:
        self.prefix = np.zeros(1, dtype=np.uint64)  # prefix[m]: the hash of the first m tokens
        self.n = 0
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        extend_all([self], [tokens])

    def room(self, n: int) -> None:
        """Room for n tokens' hashes: a conversation goes on growing, so one allocation per doubling."""
        if len(self.prefix) < n + 1:
            grown = np.empty(max(n + 1 + HEADROOM_TOKENS, 2 * len(self.prefix)), dtype=np.uint64)
            grown[: self.n + 1] = self.prefix[: self.n + 1]
            self.prefix = grown

    def truncate(self, n: int) -> None:
        """Only the first n tokens stay (their hashes stand; what is appended next overwrites the rest)."""
        self.n = min(self.n, n)

    def seeds(self, seed: int, start: int = 0, end: int | None = None) -> np.ndarray:
        """The hash of each `seed` tokens from position start (up to those ending by `end`), the same
        wherever those tokens stand."""
        end = self.n if end is None else end
        last = end - seed  # the last seed's first position
        if last < start:
            return np.empty(0, dtype=np.uint64)
        p = self.prefix
        out: np.ndarray = (p[start + seed : last + seed + 1] - p[start : last + 1]) * POWERS.down[start : last + 1]
        return out


def shared_prefix(a: TokenHashes, b: TokenHashes, lo: int = 0, below: int | None = None) -> int:
    """How many first tokens the two lists share, by their hashes (a binary search: the hashes agree up to
    the shared length and, but for a collision, nowhere past it); lo: known to share at least that many;
    below: known to share fewer."""
    hi = min(a.n, b.n) if below is None else min(a.n, b.n, below - 1)
    pa, pb = a.prefix, b.prefix
    if pa[hi] == pb[hi]:
        return hi
    # pa[lo] == pb[lo]; pa[hi] != pb[hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if pa[mid] == pb[mid]:
            lo = mid
        else:
            hi = mid
    return lo

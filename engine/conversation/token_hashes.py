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


class TokenHashes:
    """One token list's prefix hashes, appended to as the list grows."""

    def __init__(self, tokens: Sequence[int] = ()) -> None:
        self.prefix = np.zeros(1, dtype=np.uint64)  # prefix[m]: the hash of the first m tokens
        self.n = 0
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        k = len(tokens)
        if not k:
            return
        n = self.n
        POWERS.at_least(n + k + 1)
        if len(self.prefix) < n + k + 1:
            # room for a conversation to go on growing: one allocation per doubling, not per append
            grown = np.empty(max(n + k + 1 + HEADROOM_TOKENS, 2 * len(self.prefix)), dtype=np.uint64)
            grown[: n + 1] = self.prefix[: n + 1]
            self.prefix = grown
        terms = _mixed(tokens) * POWERS.up[n : n + k]
        self.prefix[n + 1 : n + k + 1] = np.cumsum(terms) + self.prefix[n : n + 1]
        self.n = n + k

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


def shared_prefix(a: TokenHashes, b: TokenHashes, lo: int = 0) -> int:
    """How many first tokens the two lists share, by their hashes (a binary search: the hashes agree up to
    the shared length and, but for a collision, nowhere past it); lo: known to share at least that many."""
    hi = min(a.n, b.n)
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

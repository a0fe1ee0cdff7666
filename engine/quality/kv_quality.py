"""What a KV setting does to the model's next-token distribution, measured against an f16/f16 cache.

The measure serious users judge a KV type by (llama.cpp's `llama-perplexity --kl-divergence`, PR #7412):
the same tokens teacher-forced through a cache at the reference setting (f16 K, f16 V) and through one at
the setting under test, with the same weights, and at each position the KL divergence of the test's
next-token distribution from the reference's, KL(P_ref || P_test) in nats, and whether the top token is
the same. Figures per setting and context band: the mean KL, its 99th percentile, the share of positions
whose top token is unchanged, and how many positions they rest on.

Windows are cut as llama-perplexity cuts them, so that the two compare like with like: a document's
tokens in consecutive windows of n_ctx tokens, the first token of each window replaced by BOS where the
model adds one, and only the positions of the window's second half scored (each has at least n_ctx / 2
tokens of history: the band [n_ctx / 2, n_ctx - 1)), the last one left out as llama-perplexity leaves it.
Reference log-probabilities below LOG_P_FLOOR are left out of the sum, as there.
"""

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from swarmtune.engine.errors import UserError
from swarmtune.engine.kv.types import F16, KVSetting

REFERENCE = F16  # K and V at f16: the cache every setting is compared with
LOG_P_FLOOR = -16.0  # as llama-perplexity: reference log-probabilities below this add nothing to the KL
MIN_POSITIONS = 100  # fewer scored positions than this: the figures say so instead of a number
ROWS_AT_ONCE = 64  # log-softmax over this many positions at a time (a row is n_vocab floats)


class Scorer(Protocol):
    def logits(self, tokens: list[int], first: int) -> np.ndarray: ...


class ScoringBackend(Protocol):
    """What the measure needs of a backend (engine/backends/llama_backend.py's LlamaBackend)."""

    def new_scorer(self, kv: KVSetting, n_ctx: int) -> AbstractContextManager[Scorer]: ...


@dataclass
class BandFigures:
    """One setting at one context band: what its positions measured against the reference."""

    setting: KVSetting
    band: tuple[int, int]  # the scored positions' history, tokens: [low, high)
    positions: int = 0
    mean_kl: float | None = None  # nats per token
    p99_kl: float | None = None
    top1_same: float | None = None  # share of positions whose top token is the reference's
    source: str = "measured"
    kl: list[float] = field(default_factory=list, repr=False)  # per position, while accumulating
    same: int = 0

    def add(self, kl: np.ndarray, same: np.ndarray) -> None:
        self.kl.extend(float(x) for x in kl)
        self.same += int(same.sum())
        self.positions += len(kl)

    def close(self) -> None:
        """Fill the figures from the positions (None below MIN_POSITIONS)."""
        if self.positions >= MIN_POSITIONS:
            k = np.asarray(self.kl, dtype=np.float64)
            self.mean_kl = float(k.mean())
            self.p99_kl = float(np.percentile(k, 99))
            self.top1_same = self.same / self.positions

    def to_json(self) -> dict[str, Any]:
        return {"setting": self.setting.label, "band": list(self.band), "positions": self.positions,
                "mean_kl": self.mean_kl, "p99_kl": self.p99_kl, "top1_same": self.top1_same,
                "source": self.source if self.positions >= MIN_POSITIONS else
                f"too few positions ({self.positions} < {MIN_POSITIONS})"}

    def line(self) -> str:
        if self.mean_kl is None or self.p99_kl is None or self.top1_same is None:
            return f"{self.setting}: too few positions ({self.positions}) at contexts {self.band[0]}-{self.band[1]}"
        return (f"{self.setting}: KL {self.mean_kl:.5f} (p99 {self.p99_kl:.4f}) top-1 {self.top1_same:.1%} "
                f"at contexts {self.band[0]}-{self.band[1]}, {self.positions} positions (measured)")


def kl_and_top1(ref: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row (position): KL(P_ref || P_test) in nats, the reference's terms below LOG_P_FLOOR left out,
    and whether the two top tokens agree."""
    kl = np.empty(len(ref))
    same = np.empty(len(ref), dtype=bool)
    for i in range(0, len(ref), ROWS_AT_ONCE):
        r = _log_softmax(ref[i:i + ROWS_AT_ONCE])
        t = _log_softmax(test[i:i + ROWS_AT_ONCE])
        keep = r > LOG_P_FLOOR
        kl[i:i + ROWS_AT_ONCE] = np.where(keep, np.exp(r) * (r - t), 0.0).sum(axis=1)
        same[i:i + ROWS_AT_ONCE] = r.argmax(axis=1) == t.argmax(axis=1)
    return kl, same


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    out: np.ndarray = x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))
    return out


def windows(tokens: Sequence[int], n_ctx: int, bos: int | None, limit: int | None = None) -> Iterator[list[int]]:
    """Consecutive windows of n_ctx tokens (a shorter tail is left out), each one's first token BOS where
    the model adds one: as llama-perplexity cuts its chunks."""
    for k, start in enumerate(range(0, len(tokens) - n_ctx + 1, n_ctx)):
        if limit is not None and k >= limit:
            return
        w = list(tokens[start:start + n_ctx])
        if bos is not None:
            w[0] = bos
        yield w


def check_contexts(contexts: Iterable[int]) -> list[int]:
    out = sorted(set(contexts))
    if not out or out[0] < 16:
        raise UserError(f"context lengths are whole tokens, at least 16 (got {list(contexts)})", field="contexts")
    return out


def measure(backend: ScoringBackend, documents: Sequence[Sequence[int]], settings: Sequence[KVSetting],
            contexts: Sequence[int], bos: int | None, max_windows: int | None = None,
            progress: Callable[[int], None] | None = None) -> list[BandFigures]:
    """Every setting at every context length over the documents' windows, against the f16/f16 reference:
    a BandFigures per (setting, context). The reference's logits for a window are computed once and
    compared with each setting's."""
    if not settings:
        raise UserError("name at least one KV setting to measure, e.g. q8_0,q4_0,q8_0/f16", field="kv_type")
    contexts = check_contexts(contexts)
    out: list[BandFigures] = []
    for n_ctx in contexts:
        first = n_ctx // 2
        figs = {s: BandFigures(s, (first, n_ctx - 1)) for s in settings}
        # each document as llama-perplexity tokenizes its file: BOS first where the model adds one
        docs = [[bos, *d] if bos is not None and (not d or d[0] != bos) else list(d) for d in documents]
        wins = [w for doc in docs for w in windows(doc, n_ctx, bos)]
        if max_windows is not None:
            wins = wins[:max_windows]
        if wins:
            # every setting's context open at once (a few MB each on a small model): a window's reference
            # logits are compared with each setting's as they come, never all held
            with ExitStack() as stack:
                ref_sc = stack.enter_context(backend.new_scorer(REFERENCE, n_ctx))
                scorers = {s: stack.enter_context(backend.new_scorer(s, n_ctx)) for s in settings}
                for w in wins:
                    ref = ref_sc.logits(w, first)[:-1]  # the last position predicts nothing in the window
                    for s, sc in scorers.items():
                        kl, same = kl_and_top1(ref, sc.logits(w, first)[:-1])
                        figs[s].add(kl, same)
                    if progress:
                        progress(n_ctx)
        for f in figs.values():
            f.close()
        out += figs.values()
    return out

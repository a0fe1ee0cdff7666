"""Timed decode at a chosen batch and context, the same way for every backend.

B long contexts are built fast: one sequence is prefilled, then its cache is copied to the others.
With one KV stream per sequence this times the same as B separately prefilled agents
(tests/test_engine_real.py and `swarmtune sweep --check-copy` show it).
"""

import statistics
import time
from dataclasses import dataclass

from swarmtune.engine.backends.backend import Backend


@dataclass(frozen=True)
class DecodeTiming:
    batch: int
    context: int  # tokens in each sequence's cache when the timed steps begin
    seconds_per_step: float  # median over the timed steps
    steps: int
    started_s: float = 0.0  # perf_counter at the first timed step (a power sensor is read over this span)
    ended_s: float = 0.0
    spread_s: float = 0.0  # half the range of the timed steps' seconds: how far the median may be off (measured)

    @property
    def tokens_per_second(self) -> float:
        return self.batch / self.seconds_per_step


def filler_tokens(backend: Backend, n: int) -> list[int]:
    text = backend.text.chat([{"role": "user", "content": "def f(x):\n    return x + 1\n" * 64}], add_assistant=False)
    base = backend.text.tokenize(text) or [0]
    return (base * (n // len(base) + 1))[:n]


def fill(backend: Backend, batch: int, context: int, copy: bool = True) -> None:
    tokens = filler_tokens(backend, context)
    chunk = backend.max_chunk_tokens
    for s in range(batch):
        backend.cells.drop(s)
    for s in range(batch if not copy else 1):
        for i in range(0, context, chunk):
            backend.steps.prefill(s, tokens[i : i + chunk], i)
    if copy:
        for s in range(1, batch):
            backend.cells.copy(0, s)


def time_decode(backend: Backend, batch: int, context: int, steps: int = 8, warmup: int = 2,
                copy: bool = True, filled: bool = False) -> DecodeTiming:
    """Fill `batch` sequences to `context` tokens, then time `steps` decode steps (after `warmup`).

    With `filled`, sequence 0 already holds exactly `context` tokens and is copied, not prefilled again.
    """
    if filled:
        for s in range(1, batch):
            backend.cells.copy(0, s)
    else:
        fill(backend, batch, context, copy)
    seqs = list(range(batch))
    for s in seqs:
        backend.steps.seed_sampler(s, 1234 + s)
    tokens = filler_tokens(backend, 1) * batch
    times = []
    started = 0.0
    for i in range(warmup + steps):
        if i == warmup:
            started = time.perf_counter()
        tokens, sec = backend.steps.launch_decode(seqs, tokens, [context + i] * batch)()
        if i >= warmup:
            times.append(sec)
    ended = time.perf_counter()
    for s in seqs:
        backend.cells.truncate(s, context)
    return DecodeTiming(batch, context, statistics.median(times), steps, started, ended,
                        (max(times) - min(times)) / 2)

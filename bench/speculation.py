"""Speculation against none on the default model: the same swarm, the same prompts, greedy sampling, the
same tokens generated on both sides, at live batch 1, 2, 4 and 8.

Each side runs the engine (the synthetic swarm, no batch-1 reference steps, which would reorder its turns)
until its agents have generated `--tokens` tokens each, and is timed on the wall from the first step to
that one: prefill included, the same on both sides. Sides alternate, `--rounds` rounds, medians with
min-max. It prints, per batch, tokens per second each side, the ratio (drafts over none), the drafted and
accepted tokens, and whether each agent's first turn is the same tokens on both sides (greedy).

Not yet here (issue 52): the aider-like and opencode-like traces, and llama-server's n-gram speculation as a
third side.

    python bench/speculation.py                       # batch 1 2 4 8, --draft 4, 8, auto (~14 min, 2 cores)
    python bench/speculation.py --batches 1 --drafts 8 --rounds 3
"""

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("SWARMTUNE_CHECK", "0")  # as users run it: the cache check is a test's

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_name  # noqa: E402

from swarmtune.engine.agents.agent import Agent  # noqa: E402
from swarmtune.engine.backends.llama_backend import LlamaBackend  # noqa: E402
from swarmtune.engine.batch_runner import BatchRunner  # noqa: E402
from swarmtune.engine.conversation.sampling import SamplingParams  # noqa: E402
from swarmtune.engine.engine import Engine, EngineSettings  # noqa: E402
from swarmtune.engine.model.default_model import default_model_path  # noqa: E402
from swarmtune.engine.model.model_facts import read_model_facts  # noqa: E402
from swarmtune.parsing import AUTO_DRAFT_TOKENS  # noqa: E402


@dataclass
class Side:
    wall_s: float
    tokens: int
    drafted: int
    accepted: int
    first_turns: dict[int, list[int]] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s


def run_side(batch: int, draft: str, tokens_per_agent: int, threads: int) -> Side:
    streams: dict[int, list[int]] = defaultdict(list)
    ended: set[int] = set()
    goes_on = BatchRunner.goes_on

    def seen(self: BatchRunner, a: Agent, tok: int) -> bool:
        if a.id not in ended:
            streams[a.id].append(tok)
        on = goes_on(self, a, tok)
        if not on:
            ended.add(a.id)
        return on

    BatchRunner.goes_on = seen  # type: ignore[method-assign]
    b = LlamaBackend(read_model_facts(default_model_path()), n_threads=threads)
    b.seed_sampler = lambda seq, seed: b.samplers.set(seq, SamplingParams(temperature=0.0, seed=seed))  # type: ignore
    n, auto = (AUTO_DRAFT_TOKENS, True) if draft == "auto" else (int(draft), False)
    e = Engine(b, EngineSettings(agents=batch, batch_cap=batch, draft_tokens=n, draft_auto=auto, seed=1,
                                 gen_tokens=256, reference=False, check=False))
    try:
        generated = drafted = accepted = 0
        t0 = time.perf_counter()
        while generated < tokens_per_agent * batch:
            r = e.step()
            if r.kind == "decode":
                generated += r.tokens
                drafted += r.drafted
                accepted += r.accepted
        wall = time.perf_counter() - t0
    finally:
        BatchRunner.goes_on = goes_on  # type: ignore[method-assign]
        e.close()
    return Side(wall, generated, drafted, accepted, dict(streams))


def same_first_turns(a: Side, b: Side) -> bool:
    """Each agent's first turn, as far as both sides went, the same tokens."""
    return all(t[:n] == b.first_turns.get(i, [])[:n] for i, t in a.first_turns.items()
               for n in [min(len(t), len(b.first_turns.get(i, [])))])


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--drafts", nargs="+", default=["4", "8", "auto"], help="draft lengths, or auto")
    ap.add_argument("--tokens", type=int, default=128, help="tokens each agent generates on every side")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores; default model, greedy, the synthetic swarm; "
          f"{a.tokens} tokens an agent; rounds {a.rounds}, sides alternated; medians (min-max)")
    worst: list[tuple[float, str]] = []
    for batch in a.batches:
        sides: dict[str, list[Side]] = {d: [] for d in ["0", *a.drafts]}
        order = ["0", *a.drafts]
        for r in range(a.rounds):
            for d in (order if r % 2 == 0 else order[::-1]):
                sides[d].append(run_side(batch, d, a.tokens, a.threads))
        none = sides["0"]
        print(f"batch {batch}: none {spread([s.tokens_per_s for s in none])} tok/s")
        for d in a.drafts:
            ratios = [s.tokens_per_s / n.tokens_per_s for s, n in zip(sides[d], none, strict=True)]
            acc = sum(s.accepted for s in sides[d]) / max(1, sum(s.drafted for s in sides[d]))
            same = all(same_first_turns(s, n) for s, n in zip(sides[d], none, strict=True))
            print(f"  --draft {d}: {spread([s.tokens_per_s for s in sides[d]])} tok/s, vs none {spread(ratios)}; "
                  f"accepted {acc:.0%} of {sum(s.drafted for s in sides[d]) // a.rounds} drafted a round; "
                  f"greedy first turns identical: {same}")
            worst.append((statistics.median(ratios), f"batch {batch}, --draft {d}"))
    best = max(worst)
    low = min(worst)
    print(f"best vs none: {best[0]:.3f} ({best[1]})")
    print(f"worst vs none: {low[0]:.3f} ({low[1]})")


if __name__ == "__main__":
    main()

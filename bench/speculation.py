"""Speculation against none on the default model, greedy, the same tokens generated on every side, at live
batch 1, 2, 4 and 8, sides alternated over rounds, medians with min-max.

- The synthetic swarm (the engine in-process, no batch-1 reference steps, which would reorder its turns): each
  side runs until its agents generated `--tokens` tokens each, timed on the wall from the first step to that
  one, prefill included; `--draft` lengths and auto against none; each agent's first turn compared.
- The traces (bench/spec_traces.py: aider's whole-file edit, opencode), served: `swarmtune serve --clients`
  without drafts, with `--draft auto`, llama-server with its best n-gram speculation (each `--spec-type`
  of the pinned llama.cpp tried in a first round, the best kept and named), and llama-server without it (what
  its drafts gain, apart from the two engines' plain decode); each client's streams timed from their first
  text byte to their last (the decode; time to first token printed apart); greedy texts compared.

Last lines: `speculation vs none: X (lo-hi)` (auto, batch 1, the edit trace), `vs llama-server spec: X
(lo-hi)` (the same against llama-server's best), `worst vs none: X` over every condition.

    python bench/speculation.py                                 # everything (about an hour on 2 cores)
    python bench/speculation.py --workloads traces --traces edit --trace-batches 1
    python bench/speculation.py --workloads synthetic --batches 1 --drafts 8 --rounds 3
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
    b.steps.seed_sampler = lambda seq, seed: b.samplers.set(seq, SamplingParams(temperature=0.0, seed=seed))  # type: ignore
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


def synthetic(a: argparse.Namespace, worst: list[tuple[float, str]]) -> None:
    print(f"the synthetic swarm: {a.tokens} tokens an agent")
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
            worst.append((statistics.median(ratios), f"synthetic, batch {batch}, --draft {d}"))


def traces(a: argparse.Namespace, worst: list[tuple[float, str]]) -> dict[str, list[float]]:
    """Per the bar's condition (auto, batch 1, edit): its ratios against none and against llama-server."""
    import spec_traces as st

    model = str(default_model_path())
    llama = None if a.no_llama_server else (a.llama_server or st_build())
    bar: dict[str, list[float]] = {}
    for name in a.traces:
        for batch in a.trace_batches:
            def side(which: str, name: str = name, batch: int = batch) -> st.Run:
                return st.run_side(which, name, batch, a.trace_turns, a.max_tokens, a.ctx, a.threads, model, llama)

            best = None
            if llama is not None:  # the first round picks llama-server's best type on this trace and batch
                tried = {}
                for spec in st.LLAMA_SPEC_TYPES:
                    try:
                        tried[spec] = side(f"llama-server:{spec}").decode_tokens_per_s
                    except (RuntimeError, SystemExit) as e:
                        print(f"  llama-server --spec-type {spec}: did not run ({e})")
                best = max(tried, key=lambda k: tried[k]) if tried else None
                print(f"{name}, batch {batch}: llama-server's types " +
                      ", ".join(f"{k} {v:.1f}" for k, v in tried.items()) + f" tok/s a stream; best {best}")
            # llama-server without drafts too: its speculation's gain apart from the two engines' plain decode
            order = ["swarmtune-none", "swarmtune-auto"]
            order += [f"llama-server:{best}", "llama-server:none"] if best else []
            runs: dict[str, list[st.Run]] = {k: [] for k in order}
            for r in range(a.rounds):
                for k in (order if r % 2 == 0 else order[::-1]):
                    runs[k].append(side(k))
            none, auto = runs["swarmtune-none"], runs["swarmtune-auto"]
            tokens = {k: v[0].tokens for k, v in runs.items()}
            same = all(x.texts() == y.texts() for x, y in zip(auto, none, strict=True))
            print(f"{name}, batch {batch}: tokens generated a round {tokens}; decode tok/s a stream, first text "
                  f"byte to last; time to first token (median) apart")
            for k, v in runs.items():
                print(f"  {k}: {spread([x.decode_tokens_per_s for x in v])} tok/s, "
                      f"ttft {statistics.median(x.ttft_s for x in v):.2f} s")
            vs_none = [x.decode_tokens_per_s / y.decode_tokens_per_s for x, y in zip(auto, none, strict=True)]
            print(f"  auto vs none {spread(vs_none)}; greedy texts identical: {same}")
            worst.append((statistics.median(vs_none), f"{name}, batch {batch}, auto"))
            if best:
                vs_ll = [x.decode_tokens_per_s / y.decode_tokens_per_s
                         for x, y in zip(auto, runs[f"llama-server:{best}"], strict=True)]
                print(f"  auto vs llama-server {best} {spread(vs_ll)}")
                ll_none = runs["llama-server:none"]
                own = [x.decode_tokens_per_s / y.decode_tokens_per_s
                       for x, y in zip(runs[f"llama-server:{best}"], ll_none, strict=True)]
                plain = [x.decode_tokens_per_s / y.decode_tokens_per_s for x, y in zip(none, ll_none, strict=True)]
                print(f"  llama-server {best} vs its none {spread(own)}; swarmtune none vs llama-server none "
                      f"{spread(plain)}")
                if name == "edit" and batch == 1:
                    bar["llama"] = vs_ll
            if name == "edit" and batch == 1:
                bar["none"] = vs_none
    return bar


def st_build() -> str:
    from llama_tools import build_tool

    return build_tool("llama-server")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", nargs="+", default=["traces", "synthetic"], choices=["traces", "synthetic"])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8], help="the synthetic swarm's")
    ap.add_argument("--drafts", nargs="+", default=["4", "8", "auto"], help="draft lengths, or auto (synthetic)")
    ap.add_argument("--tokens", type=int, default=128, help="tokens each agent generates on every side (synthetic)")
    ap.add_argument("--traces", nargs="+", default=list(("edit", "opencode")), choices=["edit", "opencode"])
    ap.add_argument("--trace-batches", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--trace-turns", type=int, default=3, help="turns each client sends")
    ap.add_argument("--max-tokens", type=int, default=128, help="tokens each turn generates (ignore_eos)")
    ap.add_argument("--ctx", type=int, default=4096, help="context per agent (per slot on llama-server)")
    ap.add_argument("--llama-server", default=None, help="the binary (default: bench/build_llama_server.sh)")
    ap.add_argument("--no-llama-server", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores; default model, greedy; rounds {a.rounds}, sides "
          f"alternated; medians (min-max)")
    worst: list[tuple[float, str]] = []
    bar: dict[str, list[float]] = {}
    if "traces" in a.workloads:
        bar = traces(a, worst)
    if "synthetic" in a.workloads:
        synthetic(a, worst)
    if "none" in bar:
        print(f"speculation vs none: {spread(bar['none'])}")
    if "llama" in bar:
        print(f"vs llama-server spec: {spread(bar['llama'])}")
    low = min(worst)
    print(f"worst vs none: {low[0]:.3f} ({low[1]})")


if __name__ == "__main__":
    main()

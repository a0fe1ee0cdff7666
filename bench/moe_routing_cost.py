"""What measuring MoE routing costs: decode step time with the eval callback reading the routing, with it
installed but asking for nothing, and without it.

A random-weight qwen3moe GGUF, three llama.cpp contexts on the same weights, timed in alternating blocks
so that load on a shared machine hits all alike. The callback costs twice: llama.cpp calls it for every
graph node (a Python call each, "installed"), and each node it reads splits the graph and synchronises
("reading"). Prints the median step time of each and the relative costs (measured).

    python bench/moe_routing_cost.py [--layers 8] [--embd 512] [--batch 8] [--seconds 40]
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import tiny_gguf  # noqa: E402

from swarmtune.engine.backends.llama_backend import LlamaBackend  # noqa: E402
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.model.model_facts import read_model_facts  # noqa: E402

KV = KVSetting.parse  # a KV setting as a flag spells it


def _steps(b: LlamaBackend, batch: int, n: int, pos0: int) -> list[float]:
    seqs = list(range(batch))
    toks = [5 + s for s in seqs]
    out = []
    for i in range(n):
        toks, sec = b.steps.launch_decode(seqs, toks, [pos0 + i] * batch)()
        out.append(sec)
    for s in seqs:
        b.cells.truncate(s, pos0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--embd", type=int, default=512)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--used", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    tiny_gguf.N_EMBD = a.embd
    with tempfile.TemporaryDirectory() as d:
        path = tiny_gguf.qwen3moe(Path(d) / "moe.gguf", n_expert=a.experts, n_used=a.used, n_layer=a.layers,
                                  n_ff_exp=a.embd // 2)
        facts = read_model_facts(path)
        on = LlamaBackend(facts, n_threads=a.threads, chunk_tokens=64, measure_routing=True)
        idle = LlamaBackend(facts, n_threads=a.threads, chunk_tokens=64, measure_routing=True)
        off = LlamaBackend(facts, n_threads=a.threads, chunk_tokens=64, measure_routing=False)
        assert idle.routing is not None
        idle.routing.begin = lambda: None  # installed, never active: answers "not needed" for every node
        runs = {"reading": on, "installed": idle, "off": off}
        prompt = list(range(3, 3 + 64))
        for b in runs.values():
            b.open(KV("f16"), a.batch, 512)
            for s in range(a.batch):
                b.steps.seed_sampler(s, s)
                b.steps.prefill(s, [(t + 7 * s) % 250 + 3 for t in prompt], 0)
            _steps(b, a.batch, 4, len(prompt))  # warm up
        times: dict[str, list[float]] = {k: [] for k in runs}
        distinct: list[float] = []
        t_end = time.perf_counter() + a.seconds
        while time.perf_counter() < t_end:
            for name, b in runs.items():
                times[name] += _steps(b, a.batch, 8, len(prompt))
            if on.watch.last_distinct_experts:
                distinct.append(statistics.mean(on.watch.last_distinct_experts))
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"qwen3moe random weights: {a.layers} layers, n_embd {a.embd}, {a.experts} experts top-{a.used}, "
              f"batch {a.batch}, {a.threads} threads")
        print("median step: " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in med.items())
              + f" ({len(times['off'])} steps each)")
        for k in ("installed", "reading"):
            print(f"cost, callback {k}: {med[k] / med['off'] - 1:+.1%} of step time (measured)")
        if distinct:
            print(f"distinct experts per layer: mean {statistics.mean(distinct):.2f} measured, "
                  f"{facts.bytes_model.expected_distinct_experts(a.batch):.2f} uniform routing (modeled)")
        for b in runs.values():
            b.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

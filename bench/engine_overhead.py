"""Engine tokens/s against a minimal loop making the same llama_decode calls, in one run.

The engine runs the swarm (scheduler, workload, records); every backend call it makes is logged.
The minimal loop then replays exactly those calls on a fresh context with raw llama-cpp-python:
same batches, positions and tokens, same per-row sampling, no scheduler and no records.
Both are timed alternately (best of --rounds). The bar: ratio >= 0.95. Last line: `ratio: X`.
"""

import argparse
import time

import llama_cpp as ll

from swarmtune.engine.default_model import default_model_path
from swarmtune.engine.engine import Engine, EngineSettings
from swarmtune.engine.llama_backend import LlamaBackend
from swarmtune.engine.model_facts import read_model_facts


class LoggingBackend(LlamaBackend):
    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.calls: list[tuple] = []

    def prefill(self, seq, tokens, pos0):
        self.calls.append(("p", seq, list(tokens), pos0))
        return super().prefill(seq, tokens, pos0)

    def decode(self, seqs, tokens, positions):
        self.calls.append(("d", list(seqs), list(tokens), list(positions)))
        return super().decode(seqs, tokens, positions)

    def drop(self, seq):
        self.calls.append(("x", seq))
        return super().drop(seq)


def minimal_loop(b: LlamaBackend, calls: list[tuple], kv: str, n_seqs: int, ctx: int) -> float:
    b.open(kv, n_seqs, ctx)
    ctx_p, mem, batch = b.ctx, b.mem, b.batch
    samplers = []
    for s in range(n_seqs):
        c = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        ll.llama_sampler_chain_add(c, ll.llama_sampler_init_top_k(40))
        ll.llama_sampler_chain_add(c, ll.llama_sampler_init_temp(0.8))
        ll.llama_sampler_chain_add(c, ll.llama_sampler_init_dist(s))
        samplers.append(c)
    t0 = time.perf_counter()
    for call in calls:
        if call[0] == "x":
            ll.llama_memory_seq_rm(mem, call[1], -1, -1)
            continue
        if call[0] == "p":
            _, seq, toks, pos0 = call
            n = len(toks)
            batch.n_tokens = n
            for j in range(n):
                batch.token[j] = toks[j]
                batch.pos[j] = pos0 + j
                batch.n_seq_id[j] = 1
                batch.seq_id[j][0] = seq
                batch.logits[j] = 0
            batch.logits[n - 1] = 1
            assert ll.llama_decode(ctx_p, batch) == 0
            ll.llama_sampler_sample(samplers[seq], ctx_p, n - 1)
        else:
            _, seqs, toks, poss = call
            n = len(seqs)
            batch.n_tokens = n
            for j in range(n):
                batch.token[j] = toks[j]
                batch.pos[j] = poss[j]
                batch.n_seq_id[j] = 1
                batch.seq_id[j][0] = seqs[j]
                batch.logits[j] = 1
            assert ll.llama_decode(ctx_p, batch) == 0
            for j in range(n):
                ll.llama_sampler_sample(samplers[seqs[j]], ctx_p, j)
    elapsed = time.perf_counter() - t0
    for c in samplers:
        ll.llama_sampler_free(c)
    return elapsed


def engine_run(b: LoggingBackend, s: EngineSettings, steps: int) -> tuple[float, int, list[tuple]]:
    e = Engine(b, s)
    e.start()
    b.calls = []
    tokens = 0
    t0 = time.perf_counter()
    for _ in range(steps):
        r = e.step()
        tokens += r.tokens
    elapsed = time.perf_counter() - t0
    return elapsed, tokens, b.calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--kv", default="f16")
    ap.add_argument("--check", action="store_true", help="the engine checks every cache after each step")
    a = ap.parse_args()
    b = LoggingBackend(read_model_facts(default_model_path()), n_threads=a.threads)
    s = EngineSettings(agents=a.agents, batch_cap=a.agents, kv=a.kv, ctx_per_agent=a.ctx, reference=False,
                       check=a.check)
    best_engine = best_min = float("inf")
    for r in range(a.rounds):
        t_engine, tokens, calls = engine_run(b, EngineSettings(**vars(s)), a.steps)
        t_min = minimal_loop(b, calls, a.kv, a.agents, a.ctx)
        n_dec = sum(1 for c in calls if c[0] == "d")
        print(f"round {r + 1}: engine {tokens / t_engine:.1f} tok/s ({t_engine:.2f} s), "
              f"minimal loop {tokens / t_min:.1f} tok/s ({t_min:.2f} s); {len(calls)} calls, {n_dec} decode steps, "
              f"{tokens} tokens (measured)", flush=True)
        best_engine, best_min = min(best_engine, t_engine), min(best_min, t_min)
    b.close()
    print(f"engine {tokens / best_engine:.1f} tok/s vs minimal loop {tokens / best_min:.1f} tok/s, best of {a.rounds}"
          f" (cache check {'on' if a.check else 'off'})")
    print(f"ratio: {best_min / best_engine:.3f}")


if __name__ == "__main__":
    main()

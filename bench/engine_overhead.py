"""Engine tokens/s against a minimal loop making the same llama_decode calls, in one run.

The engine runs the swarm (scheduler, workload, records); every backend call it makes is logged.
The minimal loop then replays exactly those calls on a fresh context with raw llama-cpp-python:
same batches, positions and tokens, the same sampler chains sampled where the engine samples them (in
llama.cpp's graph unless --host-sampling), no scheduler and no records.
Rounds alternate which side runs first: engine then loop (the loop replays the calls the engine just
made), then loop then engine (the loop replays the last round's calls, the engine makes its own: the tool
waits are wall-clock, so its calls differ a little from round to round, and both counts are printed). Each
round's ratio is the engine's tokens/s over the loop's; the figure is the median of the rounds, their
min-max beside it. The bar: ratio >= 0.95. Last line: `ratio: X (lo-hi)`.
"""

import argparse
import statistics
import time

import llama_cpp as ll

from swarmtune.engine.backends.llama_backend import LlamaBackend
from swarmtune.engine.engine import Engine, EngineSettings
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.model.default_model import default_model_path
from swarmtune.engine.model.model_facts import read_model_facts


class _Logged:
    """A part of the backend (its steps or its cells) whose calls that write the cache are logged."""

    def __init__(self, inner, backend: "LoggingBackend") -> None:
        self.inner, self.backend = inner, backend  # its calls go to backend.calls (a round starts a new list)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def prefill(self, seq, tokens, pos0):
        self.backend.calls.append(("p", seq, list(tokens), pos0))
        return self.inner.prefill(seq, tokens, pos0)

    def launch_decode(self, seqs, tokens, positions):
        self.backend.calls.append(("d", list(seqs), list(tokens), list(positions)))
        return self.inner.launch_decode(seqs, tokens, positions)

    def drop(self, seq):
        self.backend.calls.append(("x", seq))
        return self.inner.drop(seq)


class LoggingBackend(LlamaBackend):
    """The engine's backend, its calls that write the cache logged (prefill, decode, drop) for the minimal
    loop to replay. Each part's wrapper is made once per context, not per call."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.calls: list[tuple] = []
        self._wrapped: dict[int, _Logged] = {}

    def _logged(self, part) -> _Logged:
        w = self._wrapped.get(id(part))
        if w is None or w.inner is not part:
            w = self._wrapped[id(part)] = _Logged(part, self)
        return w

    @property
    def steps(self):
        return self._logged(super().steps)

    @property
    def cells(self):
        return self._logged(super().cells)


def minimal_loop(b: LlamaBackend, calls: list[tuple], kv: KVSetting, n_seqs: int, ctx: int) -> float:
    b.open(kv, n_seqs, ctx)
    ctx_p, mem, batch = b.live.ctx, b.live.mem, b.live.batch
    samplers = []
    for s in range(n_seqs):
        c = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        ll.llama_sampler_chain_add(c, ll.llama_sampler_init_top_k(40))
        ll.llama_sampler_chain_add(c, ll.llama_sampler_init_temp(0.8))
        ll.llama_sampler_chain_add(c, ll.llama_sampler_init_dist(s))
        if b.samplers.device_sampling:  # as the engine's: the chain in llama.cpp's graph, the token read back
            ll.llama_set_sampler(ctx_p, s, c)
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
    b.open(kv, n_seqs, ctx)  # a fresh context for the engine: the loop's chains are bound to this one
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
    return elapsed, tokens, list(b.calls)  # a copy: the next engine's start logs into b.calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--kv", type=KVSetting.parse, default="f16")
    ap.add_argument("--check", action="store_true", help="the engine checks every cache after each step")
    a = ap.parse_args()
    b = LoggingBackend(read_model_facts(default_model_path()), n_threads=a.threads)
    s = EngineSettings(agents=a.agents, batch_cap=a.agents, kv=a.kv, ctx_per_agent=a.ctx, reference=False,
                       check=a.check)
    ratios: list[float] = []
    calls: list[tuple] = []
    calls_tokens = 0
    for r in range(a.rounds):
        engine_first = r % 2 == 0 or not calls
        if not engine_first:
            t_min, min_tokens, replayed = minimal_loop(b, calls, a.kv, a.agents, a.ctx), calls_tokens, calls
        t_engine, tokens, made = engine_run(b, EngineSettings(**vars(s)), a.steps)
        if engine_first:
            t_min, min_tokens, replayed = minimal_loop(b, made, a.kv, a.agents, a.ctx), tokens, made
        calls, calls_tokens = made, tokens
        ratios.append((tokens / t_engine) / (min_tokens / t_min))

        def what(c: list[tuple], n: int) -> str:
            return f"{len(c)} calls, {sum(1 for x in c if x[0] == 'd')} decode steps, {n} tokens"

        print(f"round {r + 1} ({'engine' if engine_first else 'loop'} first): engine {tokens / t_engine:.1f} tok/s "
              f"({t_engine:.2f} s; {what(made, tokens)}), minimal loop {min_tokens / t_min:.1f} tok/s "
              f"({t_min:.2f} s; {'the same calls' if replayed is made else what(replayed, min_tokens)}), "
              f"ratio {ratios[-1]:.3f} (measured)", flush=True)
    b.close()
    where = "in the graph (device sampling)" if b.samplers.device_sampling else "on the host"
    print(f"sampling: {where}, both sides")
    print(f"rounds: {', '.join(f'{x:.3f}' for x in ratios)} (cache check {'on' if a.check else 'off'})")
    print(f"ratio: {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()

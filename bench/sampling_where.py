"""Where each agent's token is drawn, timed: inside llama.cpp's graph (backend sampling, the default) or on
the host from its logits (--host-sampling), the same engine run on both sides.

The engine runs the synthetic swarm for --steps steps with each setting, the sides alternated round by
round (device first in odd rounds), one backend and one model load for both. On a GPU the device side
sends back a token per row instead of its logits; on a CPU build the "device" is the CPU itself, and
this bench says whether computing the chain in the graph (a softmax and a cumulative sum over the whole
vocabulary per row, on the graph's threads) costs more than the host's partial sort. Tokens differ
between the sides (a seeded draw is not the same token on both); the counts are printed. Last line:
`device vs host sampling: X (lo-hi)` (tokens/s, median of the rounds' ratios).

    python bench/sampling_where.py              # 3 rounds of 300 steps, 8 agents (~5 min, 2 cores)
"""

import argparse
import statistics
import time

from machine import cpu_name

from swarmtune.engine.backends.llama_backend import LlamaBackend
from swarmtune.engine.engine import Engine, EngineSettings
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.model.default_model import default_model_path
from swarmtune.engine.model.model_facts import read_model_facts


def run(b: LlamaBackend, s: EngineSettings, steps: int, on_device: bool) -> tuple[float, int]:
    b.samplers.device_sampling = on_device
    e = Engine(b, EngineSettings(**vars(s)))
    e.start()
    tokens = 0
    t0 = time.perf_counter()
    for _ in range(steps):
        tokens += e.step().tokens
    return time.perf_counter() - t0, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kv", type=KVSetting.parse, default="f16")
    a = ap.parse_args()
    b = LlamaBackend(read_model_facts(default_model_path()))
    print(f"machine: {cpu_name()}; {b.info.device}; {a.agents} agents, {a.steps} steps a side, KV {a.kv}")
    s = EngineSettings(agents=a.agents, batch_cap=a.agents, kv=a.kv, ctx_per_agent=a.ctx, reference=False)
    ratios = []
    for r in range(a.rounds):
        order = (True, False) if r % 2 == 0 else (False, True)
        rate = {}
        for on_device in order:
            secs, tokens = run(b, s, a.steps, on_device)
            rate[on_device] = tokens / secs
            print(f"round {r + 1}: {'device' if on_device else 'host'} sampling {tokens / secs:.1f} tok/s "
                  f"({tokens} tokens in {secs:.2f} s, measured)", flush=True)
        ratios.append(rate[True] / rate[False])
    b.close()
    print(f"rounds: {', '.join(f'{x:.3f}' for x in ratios)}")
    print(f"device vs host sampling: {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()

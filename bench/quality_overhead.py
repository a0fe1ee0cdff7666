"""What the live KV quality check costs the swarm: decode tokens/s with it on against off, same engine, same
seeded workload, same seconds, in alternated rounds (on then off, the next round off then on).

The swarm runs at q8_0, so the check always has the live setting to measure (at f16 it measures only
what the tuner may move to, and stops once that has its figures): the dearest case. Its default budget is
2% of the run's seconds (engine/quality/quality_check.py), a check starting only where what it is expected to
cost keeps that share; an agent's first check costs a prefill of its history (seconds on a 2-core CPU),
the next ones its new tokens, so a run needs minutes to hold several. The bar is a ratio >= 0.97. Each
run's rate is decode tokens over the engine's clock (wall seconds since start), the check's own seconds
included, since it runs between steps on the engine's thread. Last line: `quality check overhead ratio:
X` (the median of the rounds' ratios; their min-max printed).

    python bench/quality_overhead.py                # 3 rounds of 2 x 300 s (~31 minutes)
    python bench/quality_overhead.py --rounds 5 --seconds 300
"""

import argparse
import os
import statistics

os.environ.setdefault("SWARMTUNE_CHECK", "0")  # the cache check is for tests; it costs a real run's steps

from machine import cpu_name  # bench/, next to this script

from swarmtune.engine.backends.llama_backend import LlamaBackend
from swarmtune.engine.engine import Engine, EngineSettings
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.model.default_model import default_model_path
from swarmtune.engine.model.model_facts import read_model_facts
from swarmtune.engine.quality.quality_check import QualityCheck


def one(backend: LlamaBackend, a, checked: bool) -> tuple[float, int, float]:
    """(decode tokens/s, checks, seconds the checks took) of one run."""
    s = EngineSettings(agents=a.agents, kv=a.kv, ctx_per_agent=a.ctx, gen_tokens=64, tool_tokens=192, seed=1,
                       tool_latency_s=0.5, check=False)
    q = QualityCheck() if checked else None
    e = Engine(backend, s, quality=q)
    e.start()
    tokens = 0
    while e.now_s() < a.seconds:
        r = e.step()
        if r.kind == "decode":
            tokens += r.tokens
    rate = tokens / e.now_s()
    e.meter.close()
    return rate, (q.checks if q else 0), (q.spent_s if q else 0.0)




def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--kv", type=KVSetting.parse, default="q8_0")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores, {a.threads} threads; "
          f"{a.agents} agents at KV {a.kv}, {a.rounds} rounds of 2 x {a.seconds:.0f} s", flush=True)
    backend = LlamaBackend(read_model_facts(default_model_path()), n_threads=a.threads)
    ratios = []
    try:
        for k in range(a.rounds):
            order = (True, False) if k % 2 == 0 else (False, True)
            got = {}
            for checked in order:
                got[checked] = one(backend, a, checked)
                rate, checks, spent = got[checked]
                print(f"  round {k + 1}: check {'on ' if checked else 'off'} {rate:6.2f} tok/s (measured)"
                      + (f", {checks} checks in {spent:.2f} s ({spent / a.seconds:.1%} of the run)" if checked else ""),
                      flush=True)
            ratios.append(got[True][0] / got[False][0])
            print(f"  round {k + 1}: on / off {ratios[-1]:.3f}", flush=True)
    finally:
        backend.close()
    print(f"rounds: {', '.join(f'{r:.3f}' for r in ratios)} (min {min(ratios):.3f}, max {max(ratios):.3f})")
    print(f"quality check overhead ratio: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()

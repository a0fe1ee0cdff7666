"""What it costs to time a KV type the swarm has not run, two ways, on the default model.

The tuner times a candidate KV type in a side cache before it forecasts a switch to it
(engine/measure/kv_probe.py): the run's own type and the candidate each prefill a history of `long`
tokens there and decode a few steps at it. On a 2-core CPU that is seconds, too dear for a short run, so a
run under ten minutes does not make it (docs/tuner.md). This bench puts beside it a probe that
prefills nothing (the one a short run uses): one agent's history, already in the live cache, saved,
converted to the candidate type (engine/kv/convert.py) and restored into the side cache, for each
type; then both probes time the same decode points (engine/measure/kv_probe.py's decode_points: the
history and a short one at the batch, and the short one alone), so they differ only in how the history
gets into the side cache. Both run on
the same live swarm, alternated, `--rounds` times; each prints its wall seconds and the decode ratio it
measured (the candidate's step over the base's at the long context), so that a cheaper probe can be seen
to measure the same thing.

    python bench/probe_cost.py [--rounds 3] [--long 768] [--batch 8] [--to q8_0]

Last line: `conversion probe vs prefill probe, wall seconds: X (lo-hi)`.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from machine import cpu_name  # noqa: E402  (bench/, next to this script)

from swarmtune.engine.backends.llama_backend import LlamaBackend  # noqa: E402
from swarmtune.engine.kv.types import F16, KVSetting  # noqa: E402
from swarmtune.engine.measure.kv_probe import STEPS, WARMUP, probe_kv, probe_kv_converted  # noqa: E402
from swarmtune.engine.measure.probe import fill  # noqa: E402
from swarmtune.engine.model.default_model import default_model_path  # noqa: E402
from swarmtune.engine.model.model_facts import read_model_facts  # noqa: E402


def conversion_probe(b: LlamaBackend, base: KVSetting, kv: KVSetting, batch: int, long: int) -> tuple[float, float]:
    """(wall seconds, the candidate's decode step over the base's at `long`): the tuner's probe on a
    converted history (kv_probe.probe_kv_converted) of sequence 0 of the live cache, which holds `long`
    tokens at `base`; no prefill."""
    t0 = time.perf_counter()
    p = probe_kv_converted(b, base, kv, batch, 0, long)
    wall = time.perf_counter() - t0
    return wall, _long_ratio(p.decode, base, kv, batch, long)


def prefill_probe(b: LlamaBackend, base: KVSetting, kv: KVSetting, batch: int, long: int) -> tuple[float, float]:
    """(wall seconds, the same ratio): the tuner's probe that prefills a history in each side cache."""
    t0 = time.perf_counter()
    p = probe_kv(b, base, kv, batch, long)
    wall = time.perf_counter() - t0
    return wall, _long_ratio(p.decode, base, kv, batch, long)


def _long_ratio(decode: dict, base: KVSetting, kv: KVSetting, batch: int, long: int) -> float:
    at = {k: next(s for bb, c, s in decode[k] if bb == batch and c > long) for k in (base, kv)}
    return at[kv] / at[base]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--long", type=int, default=768, help="tokens each agent holds (the probe's long point)")
    ap.add_argument("--to", type=KVSetting.parse, default="q8_0", help="the candidate KV setting")
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    b = LlamaBackend(read_model_facts(default_model_path()), n_threads=a.threads or os.cpu_count() or 2)
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores, {b.n_threads} threads; the default model; live swarm "
          f"{a.batch} agents x {a.long} tokens at {F16}; candidate {a.to}; {a.rounds} rounds, alternated", flush=True)
    b.open(F16, a.batch, a.long + STEPS + WARMUP + 64)
    fill(b, a.batch, a.long)  # the live swarm: every agent holds `long` tokens
    walls: dict[str, list[float]] = {"prefill": [], "conversion": []}
    ratios: dict[str, list[float]] = {"prefill": [], "conversion": []}
    probes = {"prefill": prefill_probe, "conversion": conversion_probe}
    for r in range(a.rounds):
        order = ("prefill", "conversion") if r % 2 == 0 else ("conversion", "prefill")
        for name in order:
            wall, ratio = probes[name](b, F16, a.to, a.batch, a.long)
            walls[name].append(wall)
            ratios[name].append(ratio)
            print(f"round {r + 1}: {name:10s} probe {wall:5.2f} s, {a.to} decode step {ratio:.3f}x {F16}'s at "
                  f"{a.long} tokens (measured)", flush=True)
    b.close()
    for name in probes:
        print(f"{name:10s} probe: {statistics.median(walls[name]):.2f} s ({min(walls[name]):.2f}-"
              f"{max(walls[name]):.2f}), ratio {statistics.median(ratios[name]):.3f} "
              f"({min(ratios[name]):.3f}-{max(ratios[name]):.3f})")
    per = [c / p for c, p in zip(walls["conversion"], walls["prefill"], strict=True)]
    print(f"conversion probe vs prefill probe, wall seconds: {statistics.median(per):.3f} "
          f"({min(per):.3f}-{max(per):.3f})")


if __name__ == "__main__":
    main()

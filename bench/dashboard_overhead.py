"""Engine tokens/s with the dashboard running (headless, via run_test) against `swarmtune record` on
the same settings and the same range of steps (bench/stamps.py), in one run. Rounds alternate, each a pair
(record then dashboard, the next round the other way round); the figure is the median of the pairs'
ratios: run-to-run noise here is +-4% per run, and a best-of-each ratio compares one run's luck with
another's. The bar: ratio >= 0.95. Last line
`ratio: X`.

Every decode runs on a short-lived thread, as in the real commands, where one process decodes on one
thread only. llama.cpp's CPU backend parallelizes with OpenMP, and libgomp keeps a thread pool per thread
that ever decoded: two pools in one process count more threads than cores, and libgomp then stops
spinning at its barriers and sleeps in futexes instead, which cost this machine 10-15% of the decode
rate. Decoding on the bench's main thread for the record run and on the app's worker for the dashboard
run measured that artifact, not the dashboard."""

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from stamps import Stamps, on_own_thread  # bench/, next to this script

from swarmtune.engine.backends.llama_backend import LlamaBackend
from swarmtune.engine.engine import Engine, EngineSettings
from swarmtune.engine.model.default_model import default_model_path
from swarmtune.engine.model.model_facts import read_model_facts
from swarmtune.engine.record.records import RecordWriter
from swarmtune.sources.live import LiveSource
from swarmtune.tui.app import SwarmApp


def settings(a) -> EngineSettings:
    return EngineSettings(agents=a.agents, batch_cap=a.agents, ctx_per_agent=a.ctx, reference=False, seed=1)


def record_run(backend: LlamaBackend, a, out: Path) -> float:
    """What `swarmtune record` does: step, write each record, flush; timed over steps a.skip..a.skip+a.steps."""
    e = Engine(backend, settings(a))
    stamps = Stamps(e)
    e.start()
    w = RecordWriter(out)
    w.open(e.header())
    while not stamps.reached(a.skip + a.steps):
        w.write(e.step())
    w.close()
    return stamps.rate(a.skip, a.skip + a.steps)


async def dashboard_run(backend: LlamaBackend, a) -> tuple[float, float]:
    """The same steps with the dashboard drawing them (headless Textual, every panel painting): the decode
    rate, and the share of one core the UI thread (this one: the app's loop runs here) took meanwhile. That
    share is what the engine's threads lose on a small CPU, and unlike the rate it barely varies by run."""
    e = Engine(backend, settings(a))
    stamps = Stamps(e)  # the source starts the engine, on the app's worker thread
    app = SwarmApp(LiveSource(e))
    async with app.run_test(size=(160, 50)):
        while not stamps.reached(a.skip):
            await asyncio.sleep(0.02)
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        while not stamps.reached(a.skip + a.steps):
            # a plain sleep, not the pilot's pause: that one posts a callback to every widget and waits for
            # the screen, work a user's dashboard never does, and it was a tenth of the UI thread's time here
            await asyncio.sleep(0.2)
        ui_share = (time.thread_time() - cpu0) / (time.perf_counter() - wall0)
        assert app.stop_engine()
    return stamps.rate(a.skip, a.skip + a.steps), ui_share


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--skip", type=int, default=10, help="steps before the timed range (the app starting)")
    ap.add_argument("--steps", type=int, default=120, help="steps in the timed range (~15 s on 2 cores)")
    ap.add_argument("--rounds", type=int, default=8, help="an even number: as many pairs each way round")
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    backend = LlamaBackend(read_model_facts(default_model_path()), n_threads=a.threads)
    recs, dashes, shares = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            # the pairs alternate their order (record first, then dashboard first), so that a pair's second
            # run paying for its first (this VM's speed drifts over minutes) counts against neither side
            record_first = r % 2 == 0
            if record_first:
                recs.append(on_own_thread(record_run, backend, a, Path(tmp) / "r.jsonl"))
            rate, share = asyncio.run(dashboard_run(backend, a))
            if not record_first:
                recs.append(on_own_thread(record_run, backend, a, Path(tmp) / "r.jsonl"))
            dashes.append(rate)
            shares.append(share)
            print(f"round {r + 1}: record {recs[-1]:.1f} tok/s, dashboard {dashes[-1]:.1f} tok/s, "
                  f"ratio {dashes[-1] / recs[-1]:.3f} (measured, decode tokens); UI thread {share:.1%} of a core",
                  flush=True)
    backend.close()
    print(f"record {statistics.median(recs):.1f} tok/s vs dashboard {statistics.median(dashes):.1f} tok/s "
          f"(medians of {a.rounds}); best of each {max(dashes) / max(recs):.3f}; UI thread "
          f"{statistics.median(shares):.1%} of a core (median; measured, thread CPU time)")
    print(f"ratio: {statistics.median(d / r for d, r in zip(dashes, recs, strict=True)):.3f}")


if __name__ == "__main__":
    main()

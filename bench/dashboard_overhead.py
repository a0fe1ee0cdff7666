"""Engine tokens/s with the dashboard running (headless, via run_test) against `swarmtune record` on
the same settings and the same range of steps (bench/stamps.py), in one run. Rounds alternate; best of
each. The bar: ratio >= 0.95. Last line `ratio: X`."""

import argparse
import asyncio
import tempfile
from pathlib import Path

from stamps import Stamps  # bench/, next to this script

from swarmtune.engine.default_model import default_model_path
from swarmtune.engine.engine import Engine, EngineSettings
from swarmtune.engine.llama_backend import LlamaBackend
from swarmtune.engine.model_facts import read_model_facts
from swarmtune.engine.records import RecordWriter
from swarmtune.engine.sources.live import LiveSource
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


async def dashboard_run(backend: LlamaBackend, a) -> float:
    """The same steps with the dashboard drawing them (headless Textual, every panel painting)."""
    e = Engine(backend, settings(a))
    stamps = Stamps(e)
    e.start()
    app = SwarmApp(LiveSource(e))
    async with app.run_test(size=(160, 50)) as pilot:
        while not stamps.reached(a.skip + a.steps):
            await pilot.pause(0.2)
        assert app.stop_engine()
    return stamps.rate(a.skip, a.skip + a.steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--skip", type=int, default=10, help="steps before the timed range (the app starting)")
    ap.add_argument("--steps", type=int, default=120, help="steps in the timed range (~15 s on 2 cores)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    backend = LlamaBackend(read_model_facts(default_model_path()), n_threads=a.threads)
    best_rec = best_dash = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            rec = record_run(backend, a, Path(tmp) / "r.jsonl")
            dash = asyncio.run(dashboard_run(backend, a))
            print(f"round {r + 1}: record {rec:.1f} tok/s, dashboard {dash:.1f} tok/s (measured, decode tokens)",
                  flush=True)
            best_rec, best_dash = max(best_rec, rec), max(best_dash, dash)
    backend.close()
    print(f"record {best_rec:.1f} tok/s vs dashboard {best_dash:.1f} tok/s, best of {a.rounds}")
    print(f"ratio: {best_dash / best_rec:.3f}")


if __name__ == "__main__":
    main()

"""Engine tokens/s with the dashboard running (headless, via run_test) against `swarmtune record` on
the same settings, in one run. Rounds alternate; best of each. The bar: ratio >= 0.95. Last line
`ratio: X`."""

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

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
    """What `swarmtune record` does: step, write each record, flush."""
    e = Engine(backend, settings(a))
    e.start()
    w = RecordWriter(out)
    w.open(e.header())
    tokens, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < a.seconds:
        r = e.step()
        w.write(r)
        tokens += r.tokens if r.kind == "decode" else 0
    elapsed = time.perf_counter() - t0
    w.close()
    return tokens / elapsed


async def dashboard_run(backend: LlamaBackend, a) -> float:
    e = Engine(backend, settings(a))
    e.start()
    app = SwarmApp(LiveSource(e))
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause(0.5)
        decoded0, t0 = _decoded(app), time.perf_counter()
        await pilot.pause(a.seconds)
        decoded1, t1 = _decoded(app), time.perf_counter()
        assert app.stop_engine()
    return (decoded1 - decoded0) / (t1 - t0)


def _decoded(app: SwarmApp) -> int:
    r = app.stats.latest
    return sum(x.generated for x in r.agents) if r else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--seconds", type=float, default=15.0)
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

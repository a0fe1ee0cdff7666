"""How soon the dashboard answers, at the engine's default threads, with the engine decoding meanwhile:
(a) seconds from the model being loaded to the first full screen: model facts and the seed curve (they
need only the header) and the agents (they need the first step); (b) a key's effect: from a key press
(`-` / `+`, the batch cap) to the status line painted with the new cap. Several rounds, each a fresh
engine; median and worst of each. Bars: first screen under 2 s, a key under 100 ms. Last lines
`first screen: X s` and `key: X ms`."""

import argparse
import asyncio
import statistics
import time

from swarmtune.engine.default_model import default_model_path
from swarmtune.engine.engine import Engine, EngineSettings
from swarmtune.engine.llama_backend import LlamaBackend
from swarmtune.engine.model_facts import read_model_facts
from swarmtune.engine.sources.live import LiveSource
from swarmtune.tui.app import SwarmApp
from swarmtune.tui.widgets.agents import AgentsTable
from swarmtune.tui.widgets.plots import BytesPlot, SpeedupPlot
from swarmtune.tui.widgets.status import StatusLine

POLL_S = 0.01


async def first_screen(backend: LlamaBackend, a, loaded_at: float) -> tuple[float, list[float]]:
    e = Engine(backend, EngineSettings(agents=a.agents, batch_cap=a.agents, ctx_per_agent=a.ctx))
    app = SwarmApp(LiveSource(e))
    header_panels = (StatusLine, SpeedupPlot, BytesPlot)
    async with app.run_test(size=(160, 50)) as pilot:
        header_seen = agents_seen = None
        drawn: dict[type, float] = {}
        deadline = time.perf_counter() + 60
        while time.perf_counter() < deadline:
            now = time.perf_counter()
            if header_seen is None and app.stats.header:
                header_seen = now
            if agents_seen is None and app.stats.latest is not None:
                agents_seen = now
            # a panel counts once it has painted after what it shows had arrived
            for panel, since in ((p, header_seen) for p in header_panels):
                if since is not None and panel not in drawn and app.painted_at(panel) >= _mono(since):
                    drawn[panel] = now
            if agents_seen is not None and AgentsTable not in drawn and \
                    app.painted_at(AgentsTable) >= _mono(agents_seen):
                drawn[AgentsTable] = now
            if len(drawn) == 4:
                break
            await pilot.pause(POLL_S)
        if len(drawn) < 4:
            raise SystemExit(f"the first screen was not drawn within 60 s (drawn: {[p.__name__ for p in drawn]})")
        keys = []
        for k in range(a.keys):
            await pilot.pause(0.3)  # the engine decoding meanwhile, as a user finds it
            key, want = ("-", a.agents - 1) if k % 2 == 0 else ("+", a.agents)
            pressed = time.monotonic()
            # the press is awaited beside the watch: Pilot.press returns only once the app is idle, which an
            # app taking records ten times a second seldom is
            press = asyncio.ensure_future(pilot.press(key))
            end, shown = pressed + 5, None
            while time.monotonic() < end and shown is None:
                if app.source.state().batch_cap == want and app.painted_at(StatusLine) >= pressed:
                    shown = app.painted_at(StatusLine)
                await asyncio.sleep(0.001)
            await press
            keys.append((shown or time.monotonic()) - pressed)
        assert app.stop_engine()
    return max(drawn.values()) - loaded_at, keys


_offset = time.monotonic() - time.perf_counter()


def _mono(perf: float) -> float:
    """perf_counter time on the monotonic clock the app stamps its paints with."""
    return perf + _offset - 0.05  # a paint up to one poll before we noticed still shows the data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=2048, help="per agent (the default limit of `swarmtune`)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--keys", type=int, default=6, help="key presses per round")
    a = ap.parse_args()
    facts = read_model_facts(default_model_path())
    times, keys = [], []
    for r in range(a.rounds):
        t0 = time.perf_counter()
        backend = LlamaBackend(facts, n_threads=a.threads)
        loaded = time.perf_counter()
        s, k = asyncio.run(first_screen(backend, a, loaded))
        backend.close()
        times.append(s)
        keys += k
        print(f"round {r + 1}: model load {loaded - t0:.2f} s, then first screen {s:.2f} s; keys "
              + ", ".join(f"{x * 1000:.0f}" for x in k) + " ms (measured)", flush=True)
    print(f"threads: {backend.n_threads}")
    print(f"first screen: median {statistics.median(times):.2f} s, worst {max(times):.2f} s after the model load "
          f"({a.rounds} rounds; bar < 2 s)")
    print(f"key: {max(keys) * 1000:.0f} ms (worst of {len(keys)}; median {statistics.median(keys) * 1000:.0f} ms; "
          "bar < 100 ms)")


if __name__ == "__main__":
    main()

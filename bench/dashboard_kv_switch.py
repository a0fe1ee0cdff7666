"""A KV switch (f16 -> q8_0, converted in place) on the default model with the dashboard running against the
same switch headless, asked for after the same step of one seeded swarm (8 agents, contexts about --context
tokens; the dashboard's engine runs on while the key travels, so its switch can land a step later: the
cells each side converted are printed).

Rounds alternate which side runs first. Each side prints the seconds the rebuild took (the engine's own
record: the swarm is frozen meanwhile) and the cells it converted; the dashboard side also prints the share
of a core its UI thread took during the switch and, with --profile, where that time went (cProfile of the
UI thread, top functions by own time). Last line `dashboard switch: X s (headless Y s)`, medians.

    python bench/dashboard_kv_switch.py [--rounds 3] [--profile]
"""

import argparse
import asyncio
import cProfile
import os
import pstats
import statistics
import time

os.environ.setdefault("SWARMTUNE_CHECK", "0")

from stamps import on_own_thread  # bench/, next to this script

from swarmtune.engine.backends.llama_backend import LlamaBackend
from swarmtune.engine.control import Control
from swarmtune.engine.engine import Engine, EngineSettings
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.model.default_model import default_model_path
from swarmtune.engine.model.model_facts import read_model_facts
from swarmtune.engine.record.records import StepRecord
from swarmtune.sources.live import LiveSource
from swarmtune.tui.app import SwarmApp

KV = KVSetting.parse  # a KV setting as a flag spells it


def settings() -> EngineSettings:
    return EngineSettings(agents=8, ctx_per_agent=2048, gen_tokens=32, tool_tokens=448, seed=3, check=False,
                          reference=False)


def switch_step(backend: LlamaBackend, context: int) -> int:
    """The first step after which every agent holds `context` tokens: where both sides switch."""
    e = Engine(backend, settings())  # not closed: that would close the backend the rounds share
    while min((a.context for a in e.agents), default=0) < context:
        e.step()
    return e.step_index


def headless(backend: LlamaBackend, at: int) -> StepRecord:
    e = Engine(backend, settings())
    while e.step_index < at:
        e.step()
    e.request(Control(kv=KV("q8_0")))
    while (r := e.step()).kind != "rebuild":
        pass
    return r


async def dashboard(backend: LlamaBackend, at: int, profile: cProfile.Profile | None) -> tuple[StepRecord, float]:
    e = Engine(backend, settings())
    rebuilt: list[StepRecord] = []
    step = e.step

    def watched() -> StepRecord:
        r = step()
        if r.kind == "rebuild":
            rebuilt.append(r)
        return r

    e.step = watched  # type: ignore[method-assign]
    app = SwarmApp(LiveSource(e))
    async with app.run_test(size=(160, 50)) as pilot:
        while e.step_index < at:
            await asyncio.sleep(0.005)
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        if profile is not None:
            profile.enable()
        press = asyncio.ensure_future(pilot.press("k"))  # the key a user presses: f16 -> q8_0
        while not rebuilt:
            await asyncio.sleep(0.005)
        if profile is not None:
            profile.disable()
        share = (time.thread_time() - cpu0) / (time.perf_counter() - wall0)
        await press
        assert app.stop_engine()
    return rebuilt[0], share


def seconds(r: StepRecord) -> float:
    return r.seconds + r.residency_seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--context", type=int, default=900, help="tokens per agent before the switch")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--profile", action="store_true", help="profile the UI thread during the switch")
    a = ap.parse_args()
    backend = LlamaBackend(read_model_facts(default_model_path()), n_threads=a.threads)
    at = on_own_thread(switch_step, backend, a.context)
    print(f"{backend.n_threads} threads; the switch asked for after step {at}", flush=True)
    prof = cProfile.Profile() if a.profile else None
    heads, dashes = [], []
    for r in range(a.rounds):
        for side in (("headless", "dashboard") if r % 2 == 0 else ("dashboard", "headless")):
            if side == "headless":
                h = on_own_thread(headless, backend, at)
                heads.append(seconds(h))
                print(f"round {r + 1}: headless  {seconds(h):.2f} s, {h.converted_tokens + h.tokens} cells",
                      flush=True)
            else:
                d, share = asyncio.run(dashboard(backend, at, prof))
                dashes.append(seconds(d))
                print(f"round {r + 1}: dashboard {seconds(d):.2f} s, {d.converted_tokens + d.tokens} cells; UI thread "
                      f"{share:.0%} of a core meanwhile", flush=True)
    backend.close()
    if prof is not None:
        print("the UI thread during the switches (cProfile, by own time):")
        pstats.Stats(prof).sort_stats("tottime").print_stats(12)
    print(f"dashboard switch: {statistics.median(dashes):.2f} s (headless {statistics.median(heads):.2f} s; "
          f"medians of {a.rounds}, measured; bar < 1 s)")


if __name__ == "__main__":
    main()

"""Wall time per decode step against the device's, with and without overlap, on a device-paced step.

These CPUs have no device that runs while the host goes on, so the simulated card stands in for one: its
decode step sleeps the profile's modeled seconds on the wall (a sleep leaves the GIL to the host, as a GPU
leaves the CPU). The host's work is the real serving path's, as `bench/host_overhead.py` runs it:
`swarmtune serve --sim PROFILE --clients --record FILE`, one request per agent through the server's own
bridge, each decoding until the window ends. The sim has no logits, so there is no sampling and no quality
check; placement, scheduler, record and publish run. The tuner runs with `--autotune`: on a simulated
swarm its looks forecast shadow swarms on the engine's thread, in series with the steps, for longer than a
step at 64 agents, which no overlap can hide (docs/host.md).

Overlap on: the engine launches step N+1 before step N's record is written and published (engine/engine.py).
Overlap off: device, then host, in series. Timed: the wall over a window of decode steps (from the start of
one step() to the start of another, as the runner's loop sees them), against the sum of those steps'
modeled seconds. The sides alternate, `--rounds` rounds each; medians with min-max.

    python bench/overlap.py                    # 64 agents, the seed's RX 9070 XT on a 9B model (~2 min)
    python bench/overlap.py --agents 8 64 --profile rtx4090-qwen3.5-9b

The bar (issue 51): with overlap, wall per step <= 1.05 of the modeled device step at 64 agents. Last line:
`overlap at 64 agents: wall X (lo-hi) of the modeled step; without: Y (lo-hi)`.
"""

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("SWARMTUNE_CHECK", "0")  # as users run it: the cache check is a test's

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from machine import cpu_name  # noqa: E402

from swarmtune.engine.agents.served import ServedAgents  # noqa: E402
from swarmtune.engine.backends.sim_backend import SimBackend  # noqa: E402
from swarmtune.factories import make_engine  # noqa: E402
from swarmtune.parsing import build_parser  # noqa: E402
from swarmtune.server.bridge import Bridge, Sampling  # noqa: E402
from swarmtune.server.runner import EngineRunner  # noqa: E402


@dataclass(frozen=True)
class Side:
    wall_s: float  # over the window
    modeled_s: float  # the window's decode steps, as the profile models them
    steps: int
    batch: float

    @property
    def ratio(self) -> float:
        return self.wall_s / self.modeled_s


def run_side(profile: str, agents: int, steps: int, overlap: bool, record_dir: str, autotune: bool) -> Side:
    tune = ["--autotune", "tokens_per_s"] if autotune else []
    args = build_parser().parse_args(["serve", "--sim", profile, "--clients", "--agents", str(agents), *tune,
                                      "--ctx", "4096", "--max-queue", str(agents),
                                      "--record", str(Path(record_dir) / f"rec-{agents}-{overlap}.jsonl")])
    engine = make_engine(args)
    assert isinstance(engine.backend, SimBackend)
    engine.backend.paced = True  # the device stand-in: each decode step sleeps its modeled seconds
    engine.overlap = overlap
    served = engine.workload
    assert isinstance(served, ServedAgents)
    # the sim's pacer would hold records to its clock: here the paced steps keep the time themselves
    runner = EngineRunner(engine, served=served, record_path=args.record_path, pace_sim=False)
    bridge = Bridge(runner, served)
    loop = asyncio.new_event_loop()
    loop_thread = threading.Thread(target=loop.run_forever, daemon=True)
    loop_thread.start()
    marks: list[float] = []
    modeled: list[float] = []
    batches: list[int] = []
    window = threading.Event()

    async def client(i: int) -> None:
        text = f"Agent {i}: " + " ".join(f"w{(i * 7919 + j) % 997}" for j in range(64))
        req = bridge.request(engine.backend.text.tokenize(text), None, Sampling(seed=i, ignore_eos=True), (),
                             f"agent-{i}", "chat")
        q = bridge.submit(req)
        while type(await q.get()).__name__ not in ("Finished", "Closed"):
            pass

    step = engine.step

    def marked_step() -> Any:
        # the window opens at the start of the step after the first decode of the whole swarm
        if len(marks) == 1 and len(modeled) >= steps:
            marks.append(time.perf_counter())
            window.set()
        rec = step()
        if rec.kind == "decode":
            if marks:
                modeled.append(rec.seconds)
                batches.append(rec.batch)
            elif rec.batch == min(agents, engine.s.batch_cap):
                marks.append(time.perf_counter())
        return rec

    engine.step = marked_step  # type: ignore[method-assign]
    try:
        runner.start()
        for i in range(agents):
            asyncio.run_coroutine_threadsafe(client(i), loop)
        t_end = time.monotonic() + 600
        while not window.wait(0.1):
            if runner.error or time.monotonic() > t_end:
                raise RuntimeError(f"the window did not end: {runner.error or 'timed out'}")
        return Side(wall_s=marks[1] - marks[0], modeled_s=sum(modeled[:steps]), steps=steps,
                    batch=statistics.mean(batches[:steps]))
    finally:
        served.close_all()
        runner.stop()
        loop.call_soon_threadsafe(loop.stop)
        loop_thread.join(10)
        if not loop.is_running():
            loop.close()


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, nargs="+", default=[64])
    ap.add_argument("--profile", default="rx9070xt-qwen3.5-9b")
    ap.add_argument("--steps", type=int, default=150, help="decode steps in each window")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--autotune", action="store_true", help="the tuner on (its looks run in series)")
    a = ap.parse_args()
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores; device: the simulated {a.profile}, paced (modeled "
          f"seconds slept on the wall); tuner {'on' if a.autotune else 'off'}")
    last = ""
    with tempfile.TemporaryDirectory() as d:
        for n in a.agents:
            sides: dict[bool, list[Side]] = {True: [], False: []}
            for r in range(a.rounds):
                for overlap in ((True, False) if r % 2 == 0 else (False, True)):  # alternated
                    s = run_side(a.profile, n, a.steps, overlap, d, a.autotune)
                    sides[overlap].append(s)
                    print(f"  {n} agents, round {r + 1}, overlap {'on ' if overlap else 'off'}: wall "
                          f"{s.wall_s / s.steps * 1e3:.2f} ms/step, modeled {s.modeled_s / s.steps * 1e3:.2f} "
                          f"ms/step (batch {s.batch:.1f}): {s.ratio:.3f}", flush=True)
            on, off = ([s.ratio for s in sides[k]] for k in (True, False))
            host_ms = [(s.wall_s - s.modeled_s) / s.steps * 1e3 for s in sides[False]]
            print(f"{n} agents: wall/modeled with overlap {spread(on)}, without {spread(off)}; host in series "
                  f"{statistics.median(host_ms):.2f} ms/step ({min(host_ms):.2f}-{max(host_ms):.2f})")
            last = f"overlap at {n} agents: wall {spread(on)} of the modeled step; without: {spread(off)}"
    print(last)


if __name__ == "__main__":
    main()

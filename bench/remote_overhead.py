"""Remote overhead: step-to-client SSE latency (p50, p99) at the engine's full rate, and engine
tokens/s while served with a client attached against headless over the same range of steps
(bench/stamps.py), in one run. The bar: ratio >= 0.95.
Last line `ratio: X`.

Latency is measured in one process: the engine thread stamps each record when it is produced
(perf_counter), the SSE client stamps it when it arrives; both on the same clock.

The headless run decodes on a thread of its own, as the served one does on the runner's: llama.cpp's
OpenMP keeps a thread pool per thread that ever decoded, and a second pool alive in the process (the
main thread's) made libgomp sleep at its barriers and cost the other run 10-15% (bench/dashboard_overhead.py).
Rounds are paired; the figure is the median of their ratios."""

import argparse
import asyncio
import json
import statistics
import threading
import time

import httpx
import uvicorn
from httpx_sse import connect_sse
from stamps import Stamps, on_own_thread  # bench/, next to this script

from swarmtune.engine.backends.llama_backend import LlamaBackend
from swarmtune.engine.engine import Engine, EngineSettings
from swarmtune.engine.model.default_model import default_model_path
from swarmtune.engine.model.model_facts import read_model_facts
from swarmtune.server.runner import EngineRunner
from swarmtune.server.server import make_app


def settings(a) -> EngineSettings:
    return EngineSettings(agents=a.agents, batch_cap=a.agents, ctx_per_agent=a.ctx, reference=False, seed=1)


def headless(backend, a, first: int, last: int) -> float:
    e = Engine(backend, settings(a))
    stamps = Stamps(e)
    e.start()
    while not stamps.reached(last):
        e.step()
    return stamps.rate(first, last)


def served(backend, a) -> tuple[float, list[float], int, int]:
    """The decode rate over a.steps steps from the first the client saw, the latencies, and that range."""
    runner = EngineRunner(Engine(backend, settings(a)), pace_sim=False)
    stamps = Stamps(runner.engine)
    app = make_app(runner)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    th = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    th.start()
    while not server.started:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    runner.ready.wait(120)
    latencies: list[float] = []
    with httpx.Client(base_url=url, timeout=httpx.Timeout(10, read=60)) as http:
        with connect_sse(http, "GET", "/v1/steps") as es:
            first = None
            for ev in es.iter_sse():
                now = time.perf_counter()
                if ev.event != "step":
                    continue
                step = json.loads(ev.data)["step"]
                first = step if first is None else first
                if step in stamps.at:
                    latencies.append(now - stamps.at[step])
                if step >= first + a.steps:
                    break
    server.should_exit = True
    th.join(10)
    return stamps.rate(first, first + a.steps), latencies, first, first + a.steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=120, help="steps in the timed range (~15 s on 2 cores)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    facts = read_model_facts(default_model_path())

    def backend() -> LlamaBackend:  # the server closes its engine, and the engine its backend, on shutdown
        return LlamaBackend(facts, n_threads=a.threads)

    ratios: list[float] = []
    hs: list[float] = []
    ss: list[float] = []
    lat: list[float] = []
    for r in range(a.rounds):
        s, lats, first, last = served(backend(), a)
        b = backend()
        h = on_own_thread(headless, b, a, first, last)
        b.close()
        lat += lats
        print(f"round {r + 1}: steps {first + 1}..{last}: headless {h:.1f} tok/s, served + attached {s:.1f} tok/s "
              f"(measured, decode tokens), ratio {s / h:.3f}; {len(lats)} events", flush=True)
        ratios.append(s / h)
        hs.append(h)
        ss.append(s)
    q = statistics.quantiles(lat, n=100)
    print(f"SSE step-to-client latency (measured): p50 {statistics.median(lat) * 1e3:.2f} ms, "
          f"p99 {q[98] * 1e3:.2f} ms over {len(lat)} events")
    print(f"headless {statistics.median(hs):.1f} tok/s vs served {statistics.median(ss):.1f} tok/s (medians of "
          f"{a.rounds}); best of each {max(ss) / max(hs):.3f}")
    print(f"ratio: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()

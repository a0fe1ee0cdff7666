"""Remote overhead: step-to-client SSE latency (p50, p99) at the engine's full rate, and engine
tokens/s while served with a client attached against headless, in one run. The bar: ratio >= 0.95.
Last line `ratio: X`.

Latency is measured in one process: the engine thread stamps each record when it is produced
(perf_counter), the SSE client stamps it when it arrives; both on the same clock."""

import argparse
import asyncio
import json
import statistics
import threading
import time

import httpx
import uvicorn
from httpx_sse import connect_sse

from swarmtune.engine.default_model import default_model_path
from swarmtune.engine.engine import Engine, EngineSettings
from swarmtune.engine.llama_backend import LlamaBackend
from swarmtune.engine.model_facts import read_model_facts
from swarmtune.engine.server.runner import EngineRunner
from swarmtune.engine.server.server import make_app


def settings(a) -> EngineSettings:
    return EngineSettings(agents=a.agents, batch_cap=a.agents, ctx_per_agent=a.ctx, reference=False, seed=1)


def headless(backend, a) -> float:
    e = Engine(backend, settings(a))
    e.start()
    tokens, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < a.seconds:
        r = e.step()
        tokens += r.tokens if r.kind == "decode" else 0
    return tokens / (time.perf_counter() - t0)


class StampingRunner(EngineRunner):
    """Notes when each step's record left the engine, for the latency figure."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.produced: dict[int, float] = {}
        self._orig_step = self.engine.step

        def step():
            r = self._orig_step()
            self.produced[r.step] = time.perf_counter()
            return r

        self.engine.step = step


def served(backend, a) -> tuple[float, list[float]]:
    runner = StampingRunner(Engine(backend, settings(a)), pace_sim=False)
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
            t0 = time.perf_counter()
            gen0 = runner.rolling.tokens_total
            for ev in es.iter_sse():
                now = time.perf_counter()
                if ev.event != "step":
                    continue
                step = json.loads(ev.data)["step"]
                if step in runner.produced:
                    latencies.append(now - runner.produced[step])
                if now - t0 >= a.seconds:
                    break
            rate = (runner.rolling.tokens_total - gen0) / (time.perf_counter() - t0)
    server.should_exit = True
    th.join(10)
    return rate, latencies


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    facts = read_model_facts(default_model_path())

    def backend() -> LlamaBackend:  # the server closes its engine, and the engine its backend, on shutdown
        return LlamaBackend(facts, n_threads=a.threads)

    best_h = best_s = 0.0
    lat: list[float] = []
    for r in range(a.rounds):
        b = backend()
        h = headless(b, a)
        b.close()
        s, lats = served(backend(), a)
        lat += lats
        print(f"round {r + 1}: headless {h:.1f} tok/s, served + attached {s:.1f} tok/s (measured, decode tokens); "
              f"{len(lats)} events", flush=True)
        best_h, best_s = max(best_h, h), max(best_s, s)
    q = statistics.quantiles(lat, n=100)
    print(f"SSE step-to-client latency (measured): p50 {statistics.median(lat) * 1e3:.2f} ms, "
          f"p99 {q[98] * 1e3:.2f} ms over {len(lat)} events")
    print(f"headless {best_h:.1f} tok/s vs served {best_s:.1f} tok/s, best of {a.rounds}")
    print(f"ratio: {best_s / best_h:.3f}")


if __name__ == "__main__":
    main()

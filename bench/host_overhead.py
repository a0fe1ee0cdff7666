"""The host's work per decode step, apart from the device's, on the real serving path.

What runs: `swarmtune serve --clients --record FILE --autotune tokens_per_s` as the CLI builds it (the
llama backend, served agents, the record file, the tuner and the live quality check on), with one request
per agent submitted through the server's own bridge (each token crosses to an asyncio loop in another
thread, as it does for an HTTP client; the HTTP framing itself is left out), with llama-server's default
sampling, as agents use it. Every request decodes until
the window ends (end of generation ignored), so every step of the window is a decode step of the whole
swarm, plus whatever the tuner and the quality check add.

What is timed, on the engine's thread only:
- device: inside llama_decode, llama_synchronize and llama_get_logits(_ith) (on a GPU build the waits for
  the device happen there; on the CPU build llama_decode computes); whatever is sampled inside the graph
  counts here;
- host: the wall time of the window less the device's;
- its parts, each the host time inside it (the device's and nested parts' taken out): sampling (drawing
  tokens from logits on the host: the backend's own count), record, publish, scheduler, tuner, quality,
  placement (a request's assignment and prefix search); `other` is the rest (batch fill, on_token, the
  engine's loop).

Each point runs `--rounds` times in separate engines; figures are medians with min-max. Per step, per agent,
and each one's share of a 25.2 ms step (the seed's RX 9070 XT on a 9B model) and of a 3 ms step (a small
model on an H100). Vocabularies: the default model's 49k, and a 152k one (a tiny Llama this script writes:
its host cost per row is the vocabulary's; its device step is far shorter than a real 152k model's).

    python bench/host_overhead.py                       # 8, 64, 256 agents x 49k, 152k (~35 min, 2 cores)
    python bench/host_overhead.py --agents 8 64         # the bar's point and the usual swarm (~10 min)
    python bench/host_overhead.py --agents 64 --vocab 49k

The bar (issue 51): at 64 agents, <= 150 us + 5 us per agent in the batch. Last line:
`host per step at 64 agents: X us (Y% of a 25.2 ms step)`.
"""

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("SWARMTUNE_CHECK", "0")  # as users run it: the cache check is a test's

import llama_cpp as ll

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import tiny_gguf  # noqa: E402
from machine import cpu_name  # noqa: E402

from swarmtune.engine.agents.served import ServedAgents  # noqa: E402
from swarmtune.engine.quality.quality_check import QualityCheck  # noqa: E402
from swarmtune.engine.record.recorder import Recorder  # noqa: E402
from swarmtune.engine.scheduler import Scheduler  # noqa: E402
from swarmtune.engine.tune.tuner import Tuner  # noqa: E402
from swarmtune.factories import make_engine  # noqa: E402
from swarmtune.parsing import build_parser  # noqa: E402
from swarmtune.server.bridge import Bridge, Sampling  # noqa: E402
from swarmtune.server.runner import EngineRunner  # noqa: E402

SEED_STEP_S = 0.0252  # the seed's RX 9070 XT, a 9B model, one decode step
SMALL_STEP_S = 0.003  # a 0.1-1B model on an H100
PARTS = ("sampling", "record", "publish", "scheduler", "tuner", "quality", "placement")
DEVICE_CALLS = ("llama_decode", "llama_synchronize", "llama_get_logits", "llama_get_logits_ith")


@dataclass
class _Frame:
    t0: float
    device0: float
    child_s: float = 0.0  # nested parts' wall, device included
    child_device_s: float = 0.0


@dataclass
class Ledger:
    """Seconds on the engine's thread: in device calls, and each part's own host time."""

    thread: int | None = None
    device_s: float = 0.0
    parts: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    stack: list[_Frame] = field(default_factory=list)
    decode_steps: int = 0

    def mine(self) -> bool:
        return threading.get_ident() == self.thread


def _device(ledger: Ledger, fn: Callable[..., Any]) -> Callable[..., Any]:
    def timed(*a: Any) -> Any:
        if not ledger.mine():
            return fn(*a)
        t0 = time.perf_counter()
        try:
            return fn(*a)
        finally:
            ledger.device_s += time.perf_counter() - t0
    return timed


def _part(ledger: Ledger, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def timed(*a: Any, **kw: Any) -> Any:
        if not ledger.mine():
            return fn(*a, **kw)
        f = _Frame(time.perf_counter(), ledger.device_s)
        ledger.stack.append(f)
        try:
            return fn(*a, **kw)
        finally:
            ledger.stack.pop()
            wall = time.perf_counter() - f.t0
            dev = ledger.device_s - f.device0
            ledger.parts[name] += (wall - dev) - (f.child_s - f.child_device_s)
            if ledger.stack:
                up = ledger.stack[-1]
                up.child_s += wall
                up.child_device_s += dev
    return timed


def instrument(ledger: Ledger) -> Callable[[], None]:
    """Wrap the device calls and the parts' entry points; returns what undoes it."""
    undo: list[tuple[Any, str, Any]] = []

    def wrap(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        old = getattr(owner, name)
        undo.append((owner, name, old))
        setattr(owner, name, make(old))

    for name in DEVICE_CALLS:
        wrap(ll, name, lambda fn: _device(ledger, fn))
    for owner, name, part in ((Recorder, "record", "record"), (Recorder, "tune_record", "record"),
                              (EngineRunner, "_publish", "publish"), (Scheduler, "schedule", "scheduler"),
                              (Tuner, "observe", "tuner"), (QualityCheck, "observe", "quality"),
                              (ServedAgents, "before_step", "placement")):
        wrap(owner, name, lambda fn, part=part: _part(ledger, part, fn))

    def restore() -> None:
        for owner, name, old in reversed(undo):
            setattr(owner, name, old)
    return restore


@dataclass
class Point:
    wall_s: float
    device_s: float
    decode_steps: int
    batch: float  # mean rows per decode step
    parts: dict[str, float]

    @property
    def host_per_step_s(self) -> float:
        return (self.wall_s - self.device_s) / self.decode_steps

    def part_per_step_s(self, name: str) -> float:
        return self.parts[name] / self.decode_steps


def run_point(model: str, agents: int, steps: int, prompt_tokens: int, record_dir: str) -> Point:
    ctx = max(1024, prompt_tokens + steps * 3 + 256)
    args = build_parser().parse_args(["serve", "--clients", "--agents", str(agents), "--autotune", "tokens_per_s",
                                      "--ctx", str(ctx), "--max-queue", str(agents),
                                      "--record", str(Path(record_dir) / f"rec-{agents}.jsonl"),
                                      *(["--model", model] if model else [])])
    engine = make_engine(args)
    served = engine.workload
    assert isinstance(served, ServedAgents)
    runner = EngineRunner(engine, served=served, record_path=args.record_path)
    bridge = Bridge(runner, served)
    ledger = Ledger()
    loop = asyncio.new_event_loop()
    loop_thread = threading.Thread(target=loop.run_forever, daemon=True)
    loop_thread.start()
    marks: list[tuple[float, float, dict[str, float], int]] = []  # at the window's first and last step starts
    batches: list[int] = []
    window = threading.Event()

    async def client(i: int) -> None:
        # distinct prompts: no agent continues another's conversation
        text = f"Agent {i}: " + " ".join(f"w{(i * 7919 + j) % 997}" for j in range(prompt_tokens))
        tokens = engine.backend.text.tokenize(text)[:prompt_tokens]
        req = bridge.request(tokens, None, Sampling(seed=i, ignore_eos=True), (), f"agent-{i}", "chat")
        q = bridge.submit(req)
        while type(await q.get()).__name__ not in ("Finished", "Closed"):
            pass

    step = engine.step

    def mark() -> None:
        parts = dict(ledger.parts)
        parts["sampling"] = getattr(engine.backend, "host_sampling_s", 0.0)
        marks.append((time.perf_counter(), ledger.device_s, parts, ledger.decode_steps))

    def marked_step() -> Any:
        # the window: from the start of the step after the first decode of the whole swarm, for `steps` decodes
        if ledger.thread is None:
            ledger.thread = threading.get_ident()
        if len(marks) == 1 and ledger.decode_steps >= steps:
            mark()
            window.set()
        rec = step()
        if rec.kind == "decode" and not rec.reference:
            if marks:
                ledger.decode_steps += 1
                batches.append(rec.batch)
            elif rec.batch == agents:
                mark()
        return rec

    engine.step = marked_step  # type: ignore[method-assign]
    restore = instrument(ledger)
    try:
        runner.start()
        for i in range(agents):
            asyncio.run_coroutine_threadsafe(client(i), loop)
        t_end = time.monotonic() + 1800
        while not window.wait(0.1):
            if runner.error or time.monotonic() > t_end:
                raise RuntimeError(f"the window did not end: {runner.error or 'timed out'}")
        a, b = marks
        return Point(wall_s=b[0] - a[0], device_s=b[1] - a[1], decode_steps=b[3], batch=statistics.mean(batches),
                     parts={k: b[2][k] - a[2][k] for k in PARTS})
    finally:
        served.close_all()
        runner.stop()
        restore()
        loop.call_soon_threadsafe(loop.stop)
        loop_thread.join(10)
        if not loop.is_running():
            loop.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, nargs="+", default=[8, 64, 256])
    ap.add_argument("--vocab", nargs="+", default=["49k", "152k"], choices=["49k", "152k"])
    ap.add_argument("--steps", type=int, default=24, help="decode steps in each window")
    ap.add_argument("--prompt-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores; llama-cpp-python {ll.__version__}")
    print("path: serve --clients --record --autotune tokens_per_s (quality check on); llama-server's default "
          "sampling (top-k 40, top-p 0.95, min-p 0.05, temperature 0.8), seeded; a window of "
          f"{a.steps} steps once every agent decodes; rounds {a.rounds}, medians (min-max)")
    with tempfile.TemporaryDirectory() as d:
        models = {"49k": ""}
        if "152k" in a.vocab:
            models["152k"] = str(tiny_gguf.llama_device(Path(d) / "vocab152k.gguf", n_vocab=151936))
        at64: list[float] = []
        for vocab in a.vocab:
            for n in a.agents:
                pts = [run_point(models[vocab], n, a.steps, a.prompt_tokens, d) for _ in range(a.rounds)]
                report(vocab, n, pts)
                if n == 64 and vocab == "49k":
                    at64 = [p.host_per_step_s for p in pts]
        if at64:
            med = statistics.median(at64)
            print(f"host per step at 64 agents: {med * 1e6:.0f} us ({med / SEED_STEP_S:.1%} of a 25.2 ms step)")


def _spread(xs: list[float], scale: float = 1e6, fmt: str = "{:.0f}") -> str:
    return f"{fmt.format(statistics.median(xs) * scale)} ({fmt.format(min(xs) * scale)}-{fmt.format(max(xs) * scale)})"


def report(vocab: str, n: int, pts: list[Point]) -> None:
    host = [p.host_per_step_s for p in pts]
    dev = [p.device_s / p.decode_steps for p in pts]
    batch = statistics.median(p.batch for p in pts)
    bar = 150e-6 + 5e-6 * batch
    print(f"\n{vocab} vocab, {n} agents (batch {batch:.0f}): host {_spread(host)} us/step, "
          f"{_spread([h / max(p.batch, 1) for h, p in zip(host, pts, strict=True)], fmt='{:.1f}')} us/agent; "
          f"device {_spread(dev, 1e3, '{:.1f}')} ms/step")
    med = statistics.median(host)
    print(f"  share of a 25.2 ms step {med / SEED_STEP_S:.1%}, of a 3 ms step {med / SMALL_STEP_S:.1%}; "
          f"bar 150 us + 5 us x {batch:.0f} = {bar * 1e6:.0f} us: {'met' if med <= bar else 'not met'}")
    parts = {k: [p.part_per_step_s(k) for p in pts] for k in PARTS}
    other = [h - sum(parts[k][i] for k in PARTS) for i, h in enumerate(host)]
    print("  parts, us/step: " + ", ".join(f"{k} {_spread(v)}" for k, v in [*parts.items(), ("other", other)]))


if __name__ == "__main__":
    main()

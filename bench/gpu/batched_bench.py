"""swarmtune's decode step against llama.cpp's own llama-batched-bench, point by point, on one device.

Both sides run the same pinned llama.cpp: the tool is built from the llama-cpp-python sdist swarmtune pins
(`bench/build_llama_server.sh llama-batched-bench BACKEND`), the engine is the installed llama-cpp-python,
which must drive the same backend (a Vulkan wheel against a Vulkan tool: CONTRIBUTING.md). The same model,
the same KV type for K and V, flash attention on, the same -b/-ub (the engine's n_batch = n_ubatch =
max(its prefill chunk, the agents)), the same threads, every layer offloaded (none with --backend cpu), one KV
stream per sequence on both (no -kvu), and the engine's buffer settings (bench/llama_tools.py).

At each point (B sequences at context L): llama-batched-bench prefills B sequences of L random tokens, then
times `--tg` steps of B tokens and reports S_TG = B x tg / T_TG. Its tokens are random: it samples nothing.
The engine fills B sequences to L (one prefill, copied: the same timing, tests/test_engine_real.py), then
times `--tg` calls of `LlamaBackend.decode`, each of which also samples every row on the host and waits for
the device: what a swarmtune step costs. So the ratio is the engine's own work on top of llama.cpp's
decode; it is printed per point as `engine vs llama-batched-bench`, both medians of --rounds rounds with
their min-max, the sides alternated (tool then engine, engine then tool, ...).

    python bench/gpu/batched_bench.py --backend vulkan --model tiny --batches 1,4 --contexts 64,256 --tg 8
    python bench/gpu/batched_bench.py --backend cuda        # a GPU day: the default model, B 1/8/32
    python bench/gpu/batched_bench.py --backend rocm        # where hipcc exists

--model tiny writes bench/gpu/synth_model.py's two-layer synthetic model (SmolLM2's tokenizer): the
default model decodes at 2.7 tok/s on a software device. The summary names the device that gave each
number; a software device's figures (llvmpipe) prove the script, never a speed.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from llama_tools import build_tool, engine_buffer_flags, tool_settings_line  # noqa: E402
from machine import cpu_name  # noqa: E402

from swarmtune.engine.kv.types import KVSetting  # noqa: E402

API_OF = {"cpu": None, "vulkan": "Vulkan", "cuda": "CUDA", "rocm": "ROCm"}


@dataclass
class Point:
    batch: int
    context: int
    tool_tok_s: list[float] = field(default_factory=list)
    engine_tok_s: list[float] = field(default_factory=list)

    def ratio(self) -> float:
        return statistics.median(self.engine_tok_s) / statistics.median(self.tool_tok_s)


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):9.1f} ({min(xs):.1f}-{max(xs):.1f})"


def tiny_model(work: Path) -> str:
    from swarmtune.engine.model.default_model import default_model_path

    sys.path.insert(0, str(HERE))
    import synth_model

    tok = work / "tokenizer.gguf"
    if not tok.exists():
        synth_model.extract_tokenizer(default_model_path(), tok)
    out = work / "tiny.gguf"
    synth_model.write_model(out, synth_model.SHAPES["tiny"], tok)
    return str(out)


def ctx_per_seq(contexts: list[int], tg: int) -> int:
    return ((max(contexts) + tg + 8 + 255) // 256) * 256


def run_tool(binary: str, model: str, kv: KVSetting, batch: int, contexts: list[int], tg: int, n_batch: int,
             threads: int, ngl: int) -> dict[int, float]:
    """One llama-batched-bench run at one batch over every context: {context: S_TG tok/s}."""
    cmd = [binary, "-m", model, "-c", str(batch * ctx_per_seq(contexts, tg)), "-b", str(n_batch),
           "-ub", str(n_batch), "-ctk", kv.k.name, "-ctv", kv.v.name, "-fa", "on", "-ngl", str(ngl),
           "-t", str(threads), "-npp", ",".join(map(str, contexts)), "-ntg", str(tg), "-npl", str(batch),
           "--output-format", "jsonl", *engine_buffer_flags()]
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        tail = " | ".join((p.stderr or p.stdout).strip().splitlines()[-3:])
        raise SystemExit(f"batched_bench: llama-batched-bench failed ({p.returncode}): {tail}")
    out = {}
    for line in (p.stdout + p.stderr).splitlines():
        if line.startswith("{") and '"speed_tg"' in line:
            row = json.loads(line)
            out[int(row["pp"])] = float(row["speed_tg"])
    missing = [c for c in contexts if c not in out]
    if missing:
        raise SystemExit(f"batched_bench: llama-batched-bench reported no row for contexts {missing}")
    return out


def tool_device(binary: str, ngl: int) -> str:
    """The device llama-batched-bench offloads to, as its --list-devices names it (the first one listed)."""
    if ngl == 0:
        return "CPU"
    p = subprocess.run([binary, "--list-devices"], capture_output=True, text=True, check=False)
    m = re.search(r"^\s+(\w+): (.+?) \(\d+ MiB", p.stdout + p.stderr, re.MULTILINE)
    return f"{m.group(1)}: {m.group(2)}" if m else "CPU (it lists no device)"


def run_engine(backend, kv: KVSetting, batch: int, contexts: list[int], tg: int) -> dict[int, float]:
    from swarmtune.engine.measure.probe import fill, filler_tokens

    out = {}
    backend.open(kv, batch, ctx_per_seq(contexts, tg))
    for c in contexts:
        fill(backend, batch, c)
        seqs = list(range(batch))
        for s in seqs:
            backend.steps.seed_sampler(s, 1234 + s)
        tokens = filler_tokens(backend, 1) * batch
        t0 = time.perf_counter()
        for i in range(tg):
            tokens, _ = backend.steps.launch_decode(seqs, tokens, [c + i] * batch)()
        out[c] = batch * tg / (time.perf_counter() - t0)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=sorted(API_OF), required=True,
                   help="the tool's build; the installed llama-cpp-python must drive the same one")
    p.add_argument("--model", default=None, help="a GGUF, or 'tiny' (default: the embedded default model)")
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--contexts", default="512,2048,8192")
    p.add_argument("--kv", default="f16", help="a KV setting: one type, or K/V (q8_0/f16)")
    p.add_argument("--tg", type=int, default=32, help="timed decode steps per point (llama-batched-bench -ntg)")
    p.add_argument("--chunk", type=int, default=256, help="the engine's prefill chunk (-b/-ub: max(this, B))")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--rounds", type=int, default=3, help="rounds, sides alternated (at least 3)")
    p.add_argument("--tool", default=None, help="a llama-batched-bench binary (default: built here)")
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args()
    if a.rounds < 3:
        raise SystemExit("batched_bench: --rounds must be at least 3 (the spread needs them)")
    if a.json is not None and not a.json.parent.is_dir():
        raise SystemExit(f"batched_bench: no folder for --json: {a.json.parent}")
    kv = KVSetting.parse(a.kv)
    batches = [int(x) for x in a.batches.split(",")]
    contexts = [int(x) for x in a.contexts.split(",")]

    from swarmtune.engine.backends.llama_backend import LlamaBackend
    from swarmtune.engine.model.default_model import default_model_path
    from swarmtune.engine.model.model_facts import read_model_facts

    work = Path(tempfile.mkdtemp(prefix="swarmtune-batched-bench-"))
    model = tiny_model(work) if a.model == "tiny" else (a.model or str(default_model_path()))
    cpu = a.backend == "cpu"
    backend = LlamaBackend(read_model_facts(model), n_threads=a.threads, chunk_tokens=a.chunk, cpu_only=cpu)
    want = API_OF[a.backend]
    got = backend.device.api if backend.device else None
    if got != want:
        raise SystemExit(f"batched_bench: the installed llama-cpp-python runs on {backend.info.device}, not on "
                         f"{a.backend}: install its {a.backend} build (CONTRIBUTING.md), or pick --backend "
                         f"{'cpu' if got is None else got.lower()}")
    tool = a.tool or build_tool("llama-batched-bench", a.backend)
    ngl = 0 if cpu else 99
    print(f"machine: {cpu_name()}; engine on {backend.info.device} "
          f"({backend.offloaded_layers} layers offloaded); model {Path(model).name}", flush=True)
    print(f"both: KV {kv}, flash attention on, -b/-ub max({a.chunk}, B), {a.threads} threads, -ngl {ngl}, "
          f"{a.tg} timed steps a point, {a.rounds} rounds alternated; {tool_settings_line()}", flush=True)
    if backend.device is not None and backend.device.emulated:
        print(f"{backend.device.label}: a software device on the CPU. These figures prove the script end to "
              "end and say nothing about a GPU.", flush=True)

    points = {(b, c): Point(b, c) for b in batches for c in contexts}
    tool_on = tool_device(tool, ngl)
    print(f"llama-batched-bench on {tool_on}", flush=True)
    # one untimed pass of each side: a device compiles its kernels on first use (llvmpipe: minutes, cached
    # by Mesa on disk), and neither side's first round should pay for them
    t0 = time.perf_counter()
    for b in batches:
        run_tool(tool, model, kv, b, contexts, a.tg, max(a.chunk, b), a.threads, ngl)
        run_engine(backend, kv, b, contexts, a.tg)
    print(f"warm-up (untimed, both sides): {time.perf_counter() - t0:.1f} s", flush=True)
    for r in range(a.rounds):
        order = ("tool", "engine") if r % 2 == 0 else ("engine", "tool")
        for side in order:
            t0 = time.perf_counter()
            for b in batches:
                n_batch = max(a.chunk, b)
                if side == "tool":
                    figs = run_tool(tool, model, kv, b, contexts, a.tg, n_batch, a.threads, ngl)
                    for c, v in figs.items():
                        points[(b, c)].tool_tok_s.append(v)
                else:
                    for c, v in run_engine(backend, kv, b, contexts, a.tg).items():
                        points[(b, c)].engine_tok_s.append(v)
            print(f"round {r + 1}: {side} in {time.perf_counter() - t0:.1f} s", flush=True)
    backend.close()

    print(f"\ndecode tok/s, median (min-max) of {a.rounds} rounds; llama-batched-bench on {tool_on}, "
          f"engine on {backend.info.device}")
    print(f"{'B':>3s} {'context':>8s} {'llama-batched-bench':>26s} {'swarmtune engine':>26s}")
    for pt in points.values():
        print(f"{pt.batch:3d} {pt.context:8d} {spread(pt.tool_tok_s):>26s} {spread(pt.engine_tok_s):>26s}   "
              f"engine vs llama-batched-bench: {pt.ratio():.2f}")
    ratios = [pt.ratio() for pt in points.values()]
    print(f"\nsummary: engine vs llama-batched-bench {min(ratios):.2f}-{max(ratios):.2f} over {len(ratios)} points, "
          f"on {backend.info.device}; the engine samples every row on the host, llama-batched-bench samples "
          "nothing" + (" (a software device: no GPU figure)" if backend.device and backend.device.emulated else ""))
    if a.json is not None:
        a.json.write_text(json.dumps({
            "machine": cpu_name(), "engine_device": backend.info.device, "tool_device": tool_on,
            "emulated": bool(backend.device and backend.device.emulated), "model": Path(model).name,
            "kv": kv.label, "tg": a.tg, "threads": a.threads, "tool_flags": engine_buffer_flags(),
            "points": [{**asdict(pt), "ratio": pt.ratio()} for pt in points.values()]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

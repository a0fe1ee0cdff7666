"""swarmtune's KV quality measure against llama.cpp's own, on the same text, model and settings.

llama.cpp's `llama-perplexity --kl-divergence` (built from the llama-cpp-python sdist swarmtune pins, by
bench/build_llama_server.sh llama-perplexity) first stores the f16/f16 cache's log-probabilities over the
text (--kl-divergence-base), then runs each setting's cache (-ctk / -ctv) against them. swarmtune's
`engine/quality/kv_quality.py` measures the same thing in process, on the same tokens, with the same windows (n_ctx
tokens, the second half scored, BOS first where the model adds one) and flash attention on both sides.
Both tables are printed side by side; the last line is `worst KL ratio vs llama.cpp: X`, the ratio of the
two mean KLs farthest from 1 (the bar: 0.85-1.15).

    python bench/kv_quality.py                      # builds llama-perplexity first where missing (~11 min)
    python bench/kv_quality.py --chunks 16 --ctx 1024 --json out.json

The text: Python's own argparse.py (from this interpreter's standard library: every machine has one; its
version is printed). KL is deterministic for a given build and machine: one run per side suffices, and
each side's count of scored positions is printed so that a reader can check they scored the same ones.
"""

import argparse
import json
import platform
import re
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from llama_tools import build_tool, engine_buffer_flags, tool_settings_line  # bench/, next to this script
from machine import cpu_name

from swarmtune.engine.backends.llama_backend import LlamaBackend
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.model.default_model import default_model_path
from swarmtune.engine.model.model_facts import read_model_facts
from swarmtune.engine.quality.kv_quality import measure

KV = KVSetting.parse  # a KV setting as a flag spells it

HERE = Path(__file__).resolve().parent
SETTINGS = (KV("q8_0"), KV("q4_0"), KV("q8_0/f16"), KV("f16/q8_0"))


def build_perplexity() -> str:
    return build_tool("llama-perplexity")


def llama_cpp_kld(binary: str, model: str, text: str, setting: KVSetting, base: Path, ctx: int, chunks: int,
                  threads: int) -> dict:
    """One llama-perplexity run: the base (f16/f16: its log-probabilities written) for "f16", else the setting
    against them."""
    k, v = setting.k.name, setting.v.name
    cmd = [binary, "-m", model, "-f", text, "-c", str(ctx), "-b", str(ctx), "--chunks", str(chunks),
           "-t", str(threads), "-fa", "on", "-ctk", k, "-ctv", v, "--kl-divergence-base", str(base),
           *engine_buffer_flags()]
    if setting != KV("f16"):
        cmd.append("--kl-divergence")
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        tail = "\n".join(p.stdout.splitlines()[-5:])
        raise SystemExit(f"llama-perplexity failed for {setting} ({p.returncode}):\n{tail}")
    out = {"wall_s": wall}
    for key, pattern in (("mean_kl", r"Mean\s+KLD:\s+([-\d.e+]+)\s+±\s+([-\d.e+]+)"),
                         ("p99_kl", r"99\.0%\s+KLD:\s+([-\d.e+]+)"),
                         ("top1_same", r"Same top p:\s+([-\d.e+]+)\s+±"),
                         ("chunks", r"computing over (\d+) chunks")):
        m = re.search(pattern, p.stdout)
        if m:
            out[key] = float(m.group(1))
            if key == "mean_kl":
                out["mean_kl_uncertainty"] = float(m.group(2))
    if "top1_same" in out:
        out["top1_same"] /= 100.0  # llama-perplexity prints a percentage
    return out




def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctx", type=int, default=512, help="window (llama-perplexity -c)")
    ap.add_argument("--chunks", type=int, default=8, help="windows scored (llama-perplexity --chunks)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--perplexity", default=None, help="the llama-perplexity binary (default: built here)")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    binary = a.perplexity or build_perplexity()
    model = str(default_model_path())
    text = str(Path(sysconfig.get_paths()["stdlib"]) / "argparse.py")
    print(f"CPU: {cpu_name()}, threads {a.threads}; model {Path(model).name}; "
          f"text {text} (Python {platform.python_version()}); windows of {a.ctx}, {a.chunks} of them", flush=True)
    print(tool_settings_line(), flush=True)

    # swarmtune, in process
    backend = LlamaBackend(read_model_facts(model), n_threads=a.threads)
    try:
        tokens = backend.text.tokenize(Path(text).read_text(encoding="utf-8"))
        t0 = time.perf_counter()
        figs = measure(backend, [tokens], SETTINGS, [a.ctx], bos=backend.text.bos_token(), max_windows=a.chunks)
        ours_wall = time.perf_counter() - t0
    finally:
        backend.close()
    ours = {f.setting: f for f in figs}

    # llama.cpp's own
    theirs = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base.kld"
        llama_cpp_kld(binary, model, text, KV("f16"), base, a.ctx, a.chunks, a.threads)
        for s in SETTINGS:
            theirs[s] = llama_cpp_kld(binary, model, text, s, base, a.ctx, a.chunks, a.threads)

    print("\nsetting | swarmtune KL (p99, top-1, positions) | llama-perplexity KL ± (p99, top-1, chunks) | ratio")
    ratios = []
    rows = []
    for s in SETTINGS:
        o, t = ours[s], theirs[s]
        ratio = o.mean_kl / t["mean_kl"] if o.mean_kl is not None and t.get("mean_kl") else None
        if ratio is not None:
            ratios.append(ratio)
        print(f"{s} | {o.mean_kl:.6f} ({o.p99_kl:.5f}, {o.top1_same:.2%}, {o.positions}) | "
              f"{t.get('mean_kl', float('nan')):.6f} ± {t.get('mean_kl_uncertainty', float('nan')):.6f} "
              f"({t.get('p99_kl', float('nan')):.5f}, {t.get('top1_same', float('nan')):.2%}, "
              f"{int(t.get('chunks', 0))} x {a.ctx - 1 - a.ctx // 2}) | "
              + ("n/a" if ratio is None else f"{ratio:.3f}"), flush=True)
        rows.append({"setting": s.label, "swarmtune": o.to_json(), "llama_perplexity": t, "ratio": ratio})
    print(f"swarmtune measured all settings in {ours_wall:.1f} s (one process, the reference once per window)")
    if a.json:
        a.json.write_text(json.dumps({"ctx": a.ctx, "chunks": a.chunks, "text": text, "rows": rows}, indent=1))
    if not ratios:
        sys.exit("no ratio: a side measured nothing")
    worst = max(ratios, key=lambda r: abs(r - 1.0))
    print(f"worst KL ratio vs llama.cpp: {worst:.3f}")


if __name__ == "__main__":
    main()

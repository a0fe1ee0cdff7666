"""The tuner against every static setting, under several conditions, on seeded workloads with tool waits
whose contexts grow past the KV budget: (a) the default static setting (every agent in the batch, f16,
keep), (b) each static setting of a grid of batch cap x KV type x residency (the best of them, picked in
hindsight, is the bar), (c) the tuner, started at the default and allowed the grid's KV types.

The objective is decode tokens per second of the engine's clock over the whole run (simulated seconds on
the sim profile, wall seconds on the real model; rebuilds, prefill, swaps and idle waits all count).
On a real backend every setting and the tuner run twice, the second pass in reverse order, and each
figure is the mean of its two runs (on this CPU one static setting gave 35.4 and 39.8 tok/s in two
benches): the best static setting is picked on its mean, the tuner judged on its own. A simulated run is
deterministic: one pass.

Conditions (nobody tuned the tuner on them): the simulated workload on two profiles x two seeds; the real
model at 2 and 1 threads, two seeds and a second KV budget, and, with --avx2-python, the first of them in an
environment whose llama.cpp is built for AVX2 alone (bench/avx2_env.sh: no AVX-512, no AMX, where q8_0's
attention weighs against f16 the other way). Each condition prints its ratios against the best static
setting and against the starting one, and its outcomes counted agree / disagree / inconclusive; the last
lines are the worst of each: `worst vs start: X` and `ratio: X` (the worst against the best static).
--figure writes the objective over time (the tuner's decisions marked) for the first conditions.

    python bench/autotune.py                       # every condition here (~40 min on a 2-core box)
    python bench/autotune.py --only sim            # the simulated conditions (~8 min)
    python bench/autotune.py --avx2-python .venv-avx2/bin/python   # and the real ones on an AVX2-only build
"""

import argparse
import itertools
import json
import multiprocessing
import os
import platform
import subprocess
import textwrap
import time
from pathlib import Path

os.environ.setdefault("SWARMTUNE_CHECK", "0")  # the cache check is for tests; it costs a real run's steps

from swarmtune.engine.engine import Engine, EngineSettings
from swarmtune.engine.profiles import profile
from swarmtune.engine.sim_backend import SimBackend
from swarmtune.engine.tune import Goal, Tuner

SIM = dict(profile="rx9070xt-qwen3.5-9b", seconds=480.0, agents=8, tool_latency_s=5.0, gen_tokens=256,
           tool_tokens=1024, caps=(4, 8), kvs=("f16", "q8_0"), residencies=("keep", "swap"))
SIM_CONDITIONS = [dict(profile=p, seed=s) for p in ("rx9070xt-qwen3.5-9b", "rtx4090-qwen3.5-9b") for s in (1, 2)]
# the default model on this CPU: contexts reach the budget within the minute. The grid is thinned (not the
# conditions) so that the bench fits in 40 minutes: cap 8 at both KV types (caps 2 and 4 were never the best
# static setting here); 64 s a run: the budget fills within it
REAL = dict(seconds=64.0, agents=8, tool_latency_s=1.0, gen_tokens=64, tool_tokens=192, ctx=2048,
            kv_budget_mb=120.0, caps=(8,), kvs=("f16", "q8_0"), residencies=("keep",))
# a swarm whose best setting changes as it runs (the default model, this CPU, no KV budget): agents that read
# large tool results (prefill-heavy: on a CPU with AMX q8_0's prefill slows 3.6x faster with position than
# f16's) and then write long answers (decode-heavy: q8_0's attention costs 0.3-0.45x f16's), in turn
CHANGING = dict(seconds=105.0, agents=8, tool_latency_s=0.5, gen_tokens=16, tool_tokens=384, ctx=2048,
                kv_budget_mb=None, caps=(8,), kvs=("f16", "q8_0"), residencies=("keep",),
                phases=[(0.0, dict(gen_tokens=16, tool_tokens=384)), (35.0, dict(gen_tokens=192, tool_tokens=16)),
                        (70.0, dict(gen_tokens=16, tool_tokens=384))])
# 2 and 1 threads, two seeds, two KV budgets: two conditions that differ in all three
REAL_CONDITIONS = [dict(threads=2, seed=1, kv_budget_mb=120.0), dict(threads=1, seed=2, kv_budget_mb=60.0)]


def run(make_backend, w: dict, cap: int, kv: str, residency: str, tuned: bool, seed: int) -> dict:
    backend = make_backend()
    budget = w.get("kv_budget_mb")
    p = getattr(backend, "profile", None)
    s = EngineSettings(agents=w["agents"], batch_cap=cap, kv=kv, residency=residency, seed=seed,
                       gen_tokens=w["gen_tokens"], tool_tokens=w["tool_tokens"],
                       ctx_per_agent=w.get("ctx") or (p.context_per_agent if p else 2048),
                       kv_budget_bytes=budget * 1e6 if budget else (p.kv_budget_bytes if p else None),
                       tool_latency_s=w["tool_latency_s"], check=False)
    # the run's length is known here: the tuner plans for what is left of it
    tuner = Tuner(Goal(allowed_kv=w["kvs"], run_s=w["seconds"])) if tuned else None
    e = Engine(backend, s, tuner=tuner, autotune=tuned)
    e.start()
    tokens, series, decisions = 0, [], []
    next_mark = 0.0
    phases = list(w.get("phases", []))
    while e.now_s() < w["seconds"]:
        while phases and e.now_s() >= phases[0][0]:
            e.set_workload(**phases.pop(0)[1])
        r = e.step()
        if r.kind == "decode":
            tokens += r.tokens
        if r.kind == "tune" and r.tune is not None:
            decisions.append({"t": r.t, **r.tune.to_json()})
        now = e.now_s()
        if now >= next_mark:
            series.append((round(now, 2), tokens))
            next_mark = now + w["seconds"] / 120
    if tuner is not None and (last := tuner.outcome_now(e)) is not None:
        decisions.append({"t": e.now_s(), **last.to_json()})  # the last decision, over the spans the run still had
    out = {"cap": cap, "kv": kv, "residency": residency, "tuned": tuned, "tokens": tokens,
           "seconds": e.now_s(), "tokens_per_s": tokens / e.now_s(), "series": series, "decisions": decisions,
           "final": {"cap": e.s.batch_cap, "kv": e.s.kv, "residency": e.s.residency}}
    e.meter.close()  # the backend stays open: the next run of this workload opens its cache again
    return out


def workload(name: str, make_backend, w: dict, seed: int, source: str) -> dict:
    """Every static setting of the grid and the tuner, in passes. On a real backend two passes, the second in
    reverse order (a drift of the machine's speed over the bench then weighs on every setting alike), and
    every figure is the mean of its runs: the best static setting is picked on its mean, as the tuner is
    judged on its own. A simulated run is deterministic, so one pass says all of it."""
    t0 = time.perf_counter()
    settings = [(w["agents"], "f16", "keep")] + [g for g in itertools.product(w["caps"], w["kvs"], w["residencies"])
                                                 if g != (w["agents"], "f16", "keep")]
    # the tuner runs second, between static runs, and the second pass is the first reversed: each setting's
    # runs sit at the same mean position (a drift of the machine's speed over the bench weighs on all
    # alike), and the tuner's two runs are never back to back, where one slow minute of this VM (a static
    # setting measured 28.5 tok/s in one pass and 24.6 in the other) took both of them
    order = [(settings[0], False), (settings[0], True)] + [(g, False) for g in settings[1:]]
    passes = 1 if source == "simulated" else 2
    runs: dict[tuple, list[dict]] = {}
    for k in range(passes):
        for (cap, kv, res), tuned in (order if k % 2 == 0 else order[::-1]):
            r = run(make_backend, w, cap, kv, res, tuned, seed)
            runs.setdefault((cap, kv, res, tuned), []).append(r)
            what = "tuner" if tuned else f"static cap {cap}, {kv}, {res}"
            print(f"[{name}]   pass {k + 1}: {what}: {r['tokens_per_s']:.2f} tok/s ({source})", flush=True)

    def mean(rs: list[dict]) -> float:
        return sum(r["tokens_per_s"] for r in rs) / len(rs)

    grid = [dict(runs[(*g, False)][0], tokens_per_s=mean(runs[(*g, False)]),
                 runs_tokens_per_s=[r["tokens_per_s"] for r in runs[(*g, False)]]) for g in settings]
    default, best = grid[0], max(grid, key=lambda r: r["tokens_per_s"])
    tuned_runs = runs[(*settings[0], True)]
    tuned = dict(tuned_runs[0], tokens_per_s=mean(tuned_runs),
                 runs_tokens_per_s=[r["tokens_per_s"] for r in tuned_runs],
                 decisions=[dict(d, run=i + 1) for i, r in enumerate(tuned_runs) for d in r["decisions"]])
    for d in tuned["decisions"]:
        print(f"[{name}]   tuner run {d['run']} {d['t']:7.1f} s  {d['why']}", flush=True)
    verdicts = [d.get("verdict") for d in tuned["decisions"] if d["phase"] == "measured"]
    counts = {v: verdicts.count(v) for v in ("agrees", "disagrees", "inconclusive")}
    reverted = sum(d["phase"] == "reverted" for d in tuned["decisions"])
    print(f"[{name}] outcomes: {counts['agrees']} agree, {counts['disagrees']} disagree, {counts['inconclusive']} "
          f"inconclusive; {reverted} change(s) reverted by the closed loop", flush=True)
    ratio = tuned["tokens_per_s"] / best["tokens_per_s"]
    vs_start = tuned["tokens_per_s"] / default["tokens_per_s"]

    def figs(r: dict) -> str:
        return "" if len(r["runs_tokens_per_s"]) < 2 else " (runs " + ", ".join(
            f"{x:.2f}" for x in r["runs_tokens_per_s"]) + ")"
    print(f"[{name}] default {default['tokens_per_s']:.2f}{figs(default)}, best static (cap {best['cap']}, "
          f"{best['kv']}, {best['residency']}) {best['tokens_per_s']:.2f}{figs(best)}, tuner "
          f"{tuned['tokens_per_s']:.2f}{figs(tuned)} tok/s ({source}); tuner / best static {ratio:.3f}, "
          f"tuner / default {vs_start:.3f}; {time.perf_counter() - t0:.0f} s", flush=True)
    return {"name": name, "source": source, "default": default, "grid": grid, "best": best,
            "best_mean": best["tokens_per_s"], "tuned": tuned, "ratio": ratio, "vs_start": vs_start,
            "verdicts": counts, "reverted": reverted}


def sim_condition(c: dict) -> dict:
    p = profile(c["profile"])
    w = dict(SIM, profile=c["profile"])
    return workload(f"sim {c['profile']}, seed {c['seed']}", lambda: SimBackend(p), w, c["seed"], "simulated")


def figure(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6.5 * len(results), 4.2), squeeze=False)
    for ax, res in zip(axes[0], results, strict=True):
        for key, label, color in (("default", "default static", "gray"), ("best", "best static (hindsight)", "C0"),
                                  ("tuned", "tuner", "C3")):
            r = res[key]
            if key == "best":
                label += f": cap {r['cap']}, {r['kv']}, {r['residency']}"
            xs = [t for t, _ in r["series"] if t > 0]
            ys = [n / t for t, n in r["series"] if t > 0]
            ax.plot(xs, ys, label=label, color=color)
        for d in res["tuned"]["decisions"]:
            if d["phase"] == "decided":
                ax.axvline(d["t"], color="C3", alpha=0.3, linestyle=":")
                what = ", ".join(f"{k} {d['to'][k]}" for k in d["to"] if d["to"][k] != d["from"][k])
                ax.annotate(what, (d["t"], ax.get_ylim()[1] * 0.95), rotation=90, fontsize=7, va="top", color="C3")
        clock = "simulated s" if res["source"] == "simulated" else "s"
        ax.set_xlabel(f"time ({clock})")
        ax.set_ylabel(f"decode tok/s since start ({res['source']})")
        ax.set_title(textwrap.fill(f"{res['name']}: tuner {res['ratio']:.2f} of best static", 60), fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def real_condition(c: dict, build: str) -> dict:
    from swarmtune.engine.default_model import default_model_path
    from swarmtune.engine.llama_backend import LlamaBackend
    from swarmtune.engine.model_facts import read_model_facts

    backend = LlamaBackend(read_model_facts(default_model_path()), n_threads=c["threads"])
    w = dict(REAL, kv_budget_mb=c["kv_budget_mb"])
    name = f"default model, {build}, {c['threads']} threads, seed {c['seed']}, budget {c['kv_budget_mb']:.0f} MB"
    try:
        return workload(name, lambda: backend, w, c["seed"], "measured")
    finally:
        backend.close()


def summary(r: dict) -> dict:
    return {k: r[k] for k in ("name", "source", "ratio", "vs_start", "verdicts", "reverted", "best_mean")} | {
        "best": {k: r["best"][k] for k in ("cap", "kv", "residency")}, "tuned_tokens_per_s": r["tuned"]["tokens_per_s"],
        "default_tokens_per_s": r["default"]["tokens_per_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=("sim", "real"), default=None)
    ap.add_argument("--figure", type=Path, default=None, help="write the objective over time as a PNG")
    ap.add_argument("--json", type=Path, default=None, help="write every condition's figures as JSON")
    ap.add_argument("--avx2-python", default=None,
                    help="an environment built by bench/avx2_env.sh: its real-model conditions run there too")
    ap.add_argument("--avx2-real", type=int, default=1,
                    help="how many of the real-model conditions run on the AVX2-only build too (the first)")
    ap.add_argument("--changing", action="store_true",
                    help="also the workload whose best setting changes during the run (the default model)")
    ap.add_argument("--only-changing", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--real", type=int, default=len(REAL_CONDITIONS),
                    help="how many of the real-model conditions to run (all by default)")
    ap.add_argument("--conditions", default=None, help=argparse.SUPPRESS)  # a child run: JSON list of conditions
    ap.add_argument("--build", default="native build", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.conditions is not None:  # the child of --avx2-python: its results as one JSON line on stdout
        out = [summary(real_condition(c, a.build)) for c in json.loads(a.conditions)]
        print("RESULTS " + json.dumps(out), flush=True)
        return
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores", flush=True)
    results = []
    if a.only_changing:
        a.only, a.real, a.changing = "real", 0, True
    if a.only in (None, "sim"):
        # simulated seconds do not depend on the wall clock: the sim conditions share the cores, two at a
        # time, before any real one runs alone
        with multiprocessing.get_context("spawn").Pool(min(2, os.cpu_count() or 1)) as pool:
            results += pool.map(sim_condition, SIM_CONDITIONS)
    if a.only in (None, "real"):
        results += [real_condition(c, "native build") for c in REAL_CONDITIONS[:a.real]]
        if a.avx2_python:
            which = json.dumps(REAL_CONDITIONS[:max(1, min(a.real, a.avx2_real))])
            child = subprocess.run([a.avx2_python, __file__, "--conditions", which, "--build", "AVX2-only build"],
                                   stdout=subprocess.PIPE, text=True, check=False)
            for line in child.stdout.splitlines():
                if line.startswith("RESULTS "):
                    results += json.loads(line[len("RESULTS "):])
                elif line.strip():
                    print(line, flush=True)
    changing = None
    if a.changing:
        from swarmtune.engine.default_model import default_model_path
        from swarmtune.engine.llama_backend import LlamaBackend
        from swarmtune.engine.model_facts import read_model_facts

        backend = LlamaBackend(read_model_facts(default_model_path()))
        try:
            changing = workload("changing workload: read 384-token results, write 192-token answers, read",
                                lambda: backend, CHANGING, 1, "measured")
        finally:
            backend.close()
    if a.figure:
        figure([r for r in results if "tuned" in r][:2] + ([changing] if changing else []), a.figure)
    flat = [summary(r) if "tuned" in r else r for r in results]
    if a.json:
        a.json.write_text(json.dumps(flat, indent=1), encoding="utf-8")
    print("\ncondition | tuner / best static | tuner / start | agree / disagree / inconclusive | reverted")
    for r in flat:
        v = r["verdicts"]
        print(f"{r['name']} ({r['source']}) | {r['ratio']:.3f} | {r['vs_start']:.3f} | {v['agrees']} / "
              f"{v['disagrees']} / {v['inconclusive']} | {r['reverted']}")
    totals = {k: sum(r["verdicts"][k] for r in flat) for k in ("agrees", "disagrees", "inconclusive")}
    print(f"outcomes: {totals['agrees']} agree, {totals['disagrees']} disagree, {totals['inconclusive']} inconclusive")
    if changing is not None:
        print(f"changing workload: tuner / best static {changing['ratio']:.3f}, tuner / start "
              f"{changing['vs_start']:.3f}")
    if flat:
        print(f"worst vs start: {min(r['vs_start'] for r in flat):.3f}")
        print(f"ratio: {min(r['ratio'] for r in flat):.3f}")


if __name__ == "__main__":
    main()

"""The `swarmtune` command, the top layer: it builds a source (a live engine, a recording, a remote
engine) and hands it to the dashboard, `record` or `serve`. Bad input ends in one line on stderr and
exit status 2, never a traceback."""

import argparse
import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

import swarmtune
from swarmtune.engine.errors import UserError

EXIT_BAD_INPUT = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"swarmtune: {message}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


def _positive_int(name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a whole number (got {text!r})") from None
        if v < 1:
            raise argparse.ArgumentTypeError(f"{name} must be at least 1 (got {v})")
        return v
    return parse


def _whole(name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a whole number (got {text!r})") from None
    return parse


def _finite(name: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            v = math.nan
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"{name} must be a number (got {text!r})")
        return v
    return parse


def _int_list(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers (got {text!r})") from None
    if not out or min(out) < 0:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers >= 0 (got {text!r})")
    return out


def add_engine_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--model", help="GGUF file (default: the embedded SmolLM2-135M)")
    g.add_argument("--sim", metavar="PROFILE", help="no model: simulate a hardware profile ('swarmtune profiles')")
    # agents and the batch cap are checked with the engine's own words (engine/settings.py)
    g.add_argument("--agents", type=_whole("--agents"), default=8)
    g.add_argument("--batch-cap", type=_whole("--batch-cap"), default=None,
                   help="agents per decode step (default: all)")
    g.add_argument("--kv", default="f16", help="KV cache type: f16, q8_0, q4_0, ...")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--ctx", type=_positive_int("--ctx"), default=None, help="context limit per agent, tokens")
    g.add_argument("--gen-tokens", type=_positive_int("--gen-tokens"), default=64, help="T: tokens per turn")
    g.add_argument("--tool-tokens", type=_positive_int("--tool-tokens"), default=192, help="M: tool result tokens")
    g.add_argument("--tool-latency", type=_finite("--tool-latency"), default=0.0, metavar="MEDIAN_S",
                   help="agents wait for each tool call: lognormal latency with this median, seconds, drawn from "
                        "the seed (default 0: the result arrives at once)")
    g.add_argument("--tool-latency-sigma", type=_finite("--tool-latency-sigma"), default=1.0,
                   help="the tool latency's lognormal sigma (default 1.0)")
    g.add_argument("--residency", default="keep",
                   help="where a waiting agent's history lives: keep (in the KV cache), swap (to host memory and "
                        "back, no re-prefill) or drop (re-prefilled on return)")
    g.add_argument("--autotune", metavar="OBJECTIVE", default=None,
                   help="let the tuner hold the best batch cap, KV type and residency: tokens_per_s, "
                        "joules_per_token, or floor:X (tokens/s with no agent below X tok/s); 't' in the dashboard")
    g.add_argument("--tune-kv", default=None, metavar="LIST",
                   help="KV types the tuner may use, e.g. f16,q8_0 (default: only --kv; KV precision costs "
                        "quality, and only you may trade it)")
    g.add_argument("--power-cap-w", type=_finite("--power-cap-w"), default=None,
                   help="the tuner keeps mean power under this many watts (measured or modeled)")
    g.add_argument("--kv-budget-mb", type=_finite("--kv-budget-mb"), default=None,
                   help="KV memory for the whole swarm (preempts beyond)")
    g.add_argument("--threads", type=_positive_int("--threads"), default=None)
    g.add_argument("--extra-bufts", action="store_true",
                   help="llama.cpp's extra buffer types (weight repacking); off by default: they crash AMX CPUs")
    g.add_argument("--moe-routing", action="store_true",
                   help="MoE models: count the distinct experts each decode step routes to (measured, through an "
                        "eval callback; it cost 3-27%% of step time on a 2-core CPU, so off by default: uniform "
                        "routing, modeled)")
    g.add_argument("--no-kv-convert", action="store_true",
                   help="a KV switch prefills every history again instead of converting the cached K and V")
    g.add_argument("--no-reference", action="store_true",
                   help="no interleaved batch-1 reference steps (then no measured speedup)")
    g.add_argument("--check", action="store_true",
                   help="after every step, check that each agent's cache holds exactly its history")
    g.add_argument("--power", default="auto", help="power source: auto, or one 'swarmtune power' lists")


def add_attach_flags(p: argparse.ArgumentParser, required: bool) -> None:
    g = p.add_argument_group("remote engine")
    if required:
        g.add_argument("url", help="e.g. http://gpu-box:8765 (swarmtune serve), :8080 (llama-server), :8000 (vLLM)")
    else:
        g.add_argument("--attach", dest="url", metavar="URL", default=None, help="record a remote engine instead")
    g.add_argument("--token", default=None, help="bearer token for swarmtune serve (or SWARMTUNE_TOKEN)")
    g.add_argument("--gguf", default=None, help="read W and k from this model file (llama-server, vLLM)")
    g.add_argument("--weight-bytes", type=float, default=None, help="W, when the remote does not tell")
    g.add_argument("--kv-bytes-per-token", type=float, default=None, help="k, when the remote does not tell")


def remote_source(args: argparse.Namespace):
    """A source for whatever engine answers at args.url."""
    import httpx

    from swarmtune.engine.sources.attached import ForeignSource
    from swarmtune.engine.sources.pollers import LlamaServerPoller, VllmPoller, detect
    from swarmtune.engine.sources.remote import RemoteSource

    url = args.url if "://" in args.url else f"http://{args.url}"
    token = args.token or os.environ.get("SWARMTUNE_TOKEN") or None
    try:
        kind = detect(url, token)
    except httpx.HTTPError as e:
        raise UserError(f"cannot reach {url}: {type(e).__name__}") from None
    if kind == "swarmtune":
        from swarmtune.engine.sources.client import SwarmClient

        client = SwarmClient(url, token)
        try:
            client.info()
        except httpx.HTTPError as e:
            raise UserError(f"cannot reach {url}: {type(e).__name__}") from None
        return RemoteSource(client)
    if kind == "unknown":
        raise UserError(f"{url} is not swarmtune serve, llama-server or vLLM (no /v1/info, /slots or vllm: metrics)")
    w, k, bm = args.weight_bytes, args.kv_bytes_per_token, None
    if args.gguf:
        from swarmtune.engine.model_facts import read_model_facts

        facts = read_model_facts(args.gguf)
        w = w or facts.weight_bytes
        k = k or facts.kv_bytes_per_token("f16")
        if args.weight_bytes is None and args.kv_bytes_per_token is None:
            bm = facts.bytes_model
    poller = (LlamaServerPoller if kind == "llama-server" else VllmPoller)(url, w, k, bytes_model=bm)
    return ForeignSource(poller)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="swarmtune", description="Tune an agent swarm that shares one GPU (or CPU).")
    p.add_argument("--version", action="version", version=f"swarmtune {swarmtune.__version__}")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)
    run = sub.add_parser("run", help="the live dashboard (the default)")
    add_engine_flags(run)
    rec = sub.add_parser("record", help="run headless, one JSON line per step")
    add_engine_flags(rec)
    rec.add_argument("-o", "--output", required=True, help="recording file (JSON lines)")
    add_attach_flags(rec, required=False)
    lim = rec.add_mutually_exclusive_group()
    lim.add_argument("--steps", type=_positive_int("--steps"), default=None)
    lim.add_argument("--duration", type=_finite("--duration"), default=None, help="seconds")
    sw = sub.add_parser("sweep", help="decode throughput over batch sizes x contexts")
    add_engine_flags(sw)
    sw.add_argument("--batch", type=_int_list, default=None, help="e.g. 1,2,4,8")
    sw.add_argument("--contexts", type=_int_list, default=None, help="e.g. 64,512,2048")
    sw.add_argument("--steps", type=_positive_int("--steps"), default=8, help="timed decode steps per point")
    sw.add_argument("--json", dest="json_path", help="write the rows as JSON")
    sw.add_argument("--png", dest="png_path", help="write a figure of speedup vs context")
    sw.add_argument("--check-copy", action="store_true",
                    help="also time separately prefilled agents at the largest point, against copied caches")
    sv = sub.add_parser("serve", help="the engine headless behind an HTTP API")
    add_engine_flags(sv)
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    sv.add_argument("--token", default=None, help="bearer token (or SWARMTUNE_TOKEN); required off loopback")
    at = sub.add_parser("attach", help="the dashboard on a remote engine: swarmtune serve, llama-server or vLLM")
    add_attach_flags(at, required=True)
    rp = sub.add_parser("replay", help="play a recording in the dashboard (pause, step, seek, speed)")
    rp.add_argument("file")
    rp.add_argument("--speed", type=_finite("--speed"), default=1.0, help="playback speed (2 = twice as fast)")
    tn = sub.add_parser("tune", help="run the tuner headless; print the best setting as llama-server, vLLM and "
                                     "ZINC flags")
    add_engine_flags(tn)
    tn.add_argument("--duration", type=_finite("--duration"), default=None,
                    help="seconds of the engine's clock to tune for (simulated seconds with --sim; default 600 "
                         "simulated, 120 real)")
    tn.add_argument("--json", dest="json_path", default=None, help="write the result as JSON ('-': stdout)")
    sub.add_parser("profiles", help="list the sim backend's hardware profiles")
    pw = sub.add_parser("power", help="list the power sources: available or not, and why")
    pw.add_argument("--sysfs-root", default=None, help="where sysfs is mounted (default /sys)")
    return p


def make_backend(args: argparse.Namespace):
    """The sim backend for --sim, else llama.cpp on --model (default: the embedded model)."""
    if args.sim and args.model:
        raise UserError("give --model or --sim, not both")
    if args.sim:
        from swarmtune.engine.profiles import profile
        from swarmtune.engine.sim_backend import SimBackend

        return SimBackend(profile(args.sim))
    from swarmtune.engine.default_model import default_model_path
    from swarmtune.engine.model_facts import read_model_facts

    facts = read_model_facts(args.model or default_model_path())
    try:
        from swarmtune.engine.llama_backend import LlamaBackend
    except ImportError as e:
        raise UserError(f"llama-cpp-python is not usable here ({e}); build it, or use --sim PROFILE") from None
    return LlamaBackend(facts, n_threads=args.threads, use_extra_bufts=True if args.extra_bufts else None,
                        measure_routing=True if getattr(args, "moe_routing", False) else None)


def check_flags(args: argparse.Namespace) -> None:
    """The settings flags, checked before a model loads, in the engine's own words."""
    from swarmtune.engine.settings import check_agents, check_batch_cap, check_kv, check_residency, check_tool_latency

    check_kv(args.kv)
    check_residency(args.residency)
    check_tool_latency(args.tool_latency, args.tool_latency_sigma)
    check_agents(args.agents)
    if args.batch_cap is not None:
        check_batch_cap(min(args.batch_cap, args.agents), args.agents)


def engine_settings(args: argparse.Namespace, backend):
    from swarmtune.engine.settings import EngineSettings, check_default

    prof = getattr(backend, "profile", None)
    ctx = args.ctx or (prof.context_per_agent if prof else min(2048, backend.facts.n_ctx_train or 2048))
    budget = args.kv_budget_mb * 1e6 if args.kv_budget_mb is not None else (prof.kv_budget_bytes if prof else None)
    return EngineSettings(
        agents=args.agents, batch_cap=args.batch_cap or args.agents, kv=args.kv, seed=args.seed,
        gen_tokens=args.gen_tokens, tool_tokens=args.tool_tokens, ctx_per_agent=ctx, kv_budget_bytes=budget,
        reference=not args.no_reference, check=args.check or check_default(), kv_convert=not args.no_kv_convert,
        tool_latency_s=args.tool_latency, tool_latency_sigma=args.tool_latency_sigma, residency=args.residency,
    )


def tuner_goal(args: argparse.Namespace):
    from swarmtune.engine.tuner import Goal, parse_allowed_kv, parse_objective

    objective, floor = parse_objective(args.autotune or "tokens_per_s")
    allowed = parse_allowed_kv(args.tune_kv) if args.tune_kv else (args.kv,)
    if args.kv not in allowed:
        raise UserError(f"--tune-kv {args.tune_kv} leaves out --kv {args.kv}, the type the run starts at")
    if args.power_cap_w is not None and args.power_cap_w <= 0:
        raise UserError(f"--power-cap-w must be positive (got {args.power_cap_w})")
    # a run of known length plans for what is left of it (`tune` sets its default length itself)
    return Goal(objective=objective, floor_tokens_per_s=floor, allowed_kv=allowed, power_cap_watts=args.power_cap_w,
                run_s=getattr(args, "duration", None))


def make_engine(args: argparse.Namespace, progress=None):
    from swarmtune.engine.engine import Engine
    from swarmtune.engine.power.meter import ModeledMeter, make_meter
    from swarmtune.engine.tuner import Tuner

    check_flags(args)
    goal = tuner_goal(args)
    backend = make_backend(args)
    try:
        settings = engine_settings(args, backend)
        meter = make_meter(args.power, getattr(backend, "profile", None))
        if (goal.objective == "joules_per_token" or goal.power_cap_watts) and not isinstance(meter, ModeledMeter):
            why = meter.reason if meter.label is None else f"{meter.label} measures, but cannot forecast other settings"
            raise UserError("the tuner forecasts power from a power model, which only the simulated profiles have "
                            f"(--sim); here: {why}")
        return Engine(backend, settings, progress=progress, meter=meter, tuner=Tuner(goal),
                      autotune=args.autotune is not None)
    except BaseException:
        backend.close()
        raise


def cmd_profiles(args: argparse.Namespace) -> int:
    from swarmtune.engine.profiles import PROFILES

    for p in PROFILES.values():
        print(f"{p.name:24} {p.description}")
        print(f"{'':24} {p.bytes_model.kind}: W(1) {p.weight_bytes / 1e9:.3g} GB, "
              f"k(f16) {p.kv_bytes_per_token_f16 / 1e3:.3g} KB, "
              f"{p.power_floor_watts:.0f} W + {p.power_per_agent_watts:.0f} W/agent; {p.source}")
    return 0


def cmd_power(args: argparse.Namespace) -> int:
    from swarmtune.engine.power.sensors import survey

    for a in survey(args.sysfs_root):
        print(f"{a.name:8} {'available' if a.available else 'n/a':10} {a.reason}")
    print(f"{'modeled':8} {'available':10} "
          "with --sim PROFILE: the profile's floor + per-agent watts (labelled modeled)")
    return 0


def _stop_on_signals() -> dict[str, bool]:
    flag = {"stop": False}

    def handler(signum, frame):
        flag["stop"] = True

    signal.signal(signal.SIGTERM, handler)
    return flag


def cmd_record(args: argparse.Namespace) -> int:
    """Headless: the header, then one JSON line per step, each flushed as written, from this engine or a
    remote one (`--attach`), until --steps, --duration, Ctrl-C or SIGTERM."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from swarmtune.engine.records import RecordWriter, remove_quietly
    from swarmtune.engine.sources.live import LiveSource
    from swarmtune.engine.sources.protocol import Sink

    out = Path(args.output)
    if out.is_dir():
        raise UserError(f"-o {out} is a folder; give a file name")
    if not out.parent.exists():
        raise UserError(f"cannot write {out}: folder {out.parent} does not exist")
    if args.duration is not None and args.duration <= 0:
        raise UserError(f"--duration must be positive (got {args.duration})")
    console = Console(stderr=True)
    if args.url:
        source = remote_source(args)
        attached = {"attached": args.url if "://" in args.url else f"http://{args.url}"}
    else:
        source = LiveSource(make_engine(args), pace_sim=False)  # headless: as fast as the engine steps
        attached = {}
    writer = RecordWriter(out)
    flag = _stop_on_signals()
    total = args.steps
    cols = [TextColumn("[bold]recording"), BarColumn(), TextColumn("{task.completed} steps"),
            TextColumn("{task.fields[rate]}"), TimeElapsedColumn()]
    state = {"n": 0, "decoded": 0, "t0": time.perf_counter(), "status": ""}

    def done() -> bool:
        if flag["stop"] or (total is not None and state["n"] >= total):
            return True
        return args.duration is not None and time.perf_counter() - state["t0"] >= args.duration

    try:
        with Progress(*cols, console=console, transient=False) as prog:
            task = prog.add_task("rec", total=total or args.duration, rate="")

            def on_header(h: dict) -> None:
                if not writer.opened:  # a remote engine that restarted sends its header again
                    writer.open({**h, **attached})
                    state["t0"] = time.perf_counter()

            def on_records(recs) -> None:
                for r in recs:
                    if done():
                        return
                    writer.write(r)
                    state["n"] += 1
                    state["decoded"] += r.tokens if r.kind == "decode" else 0
                if source.status != state["status"]:  # a link's state: said once, when it changes
                    state["status"] = source.status
                    if source.status:
                        prog.console.print(source.status)
                elapsed = time.perf_counter() - state["t0"]
                if state["n"] % 8 == 0 or total is not None:
                    shown = state["n"] if total is not None else min(elapsed, args.duration or elapsed)
                    prog.update(task, completed=shown, rate=f"{state['decoded'] / max(elapsed, 1e-9):.1f} tok/s")

            source.run(Sink(records=on_records, header=on_header), cancelled=done)
    except KeyboardInterrupt:
        pass
    except UserError:
        writer.close()
        remove_quietly(out)
        raise
    finally:
        writer.close()
        source.close()
    console.print(f"wrote {state['n']} steps to {out}")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from swarmtune.engine.kv_types import kv_type
    from swarmtune.engine.sweep import (
        CPU_DEFAULT_BATCHES,
        CPU_DEFAULT_CONTEXTS,
        crossover_note,
        energy_rows,
        run_sweep,
        table_columns,
        table_rows,
        write_png,
    )

    kv_type(args.kv)
    for path in (args.json_path, args.png_path):
        if path and not Path(path).parent.exists():
            raise UserError(f"cannot write {path}: folder {Path(path).parent} does not exist")
    batches = args.batch or list(CPU_DEFAULT_BATCHES)
    if min(batches) < 1:
        raise UserError("--batch values must be at least 1")
    contexts = args.contexts or list(CPU_DEFAULT_CONTEXTS)
    backend = make_backend(args)
    console = Console(stderr=True)
    limit = backend.facts.n_ctx_train
    if limit and max(contexts) + args.steps + 8 > limit and not args.sim:
        backend.close()
        raise UserError(f"context {max(contexts)} exceeds the model's trained context ({limit})")
    from swarmtune.engine.power.meter import make_meter

    try:
        meter = make_meter(args.power, getattr(backend, "profile", None))
    except UserError:
        backend.close()
        raise
    try:
        with console.status("sweeping...") as status:
            def progress(done: int, total: int) -> None:
                status.update(f"sweeping: point {done}/{total}")
            result = run_sweep(backend, args.kv, batches, contexts, steps=args.steps, check_copy=args.check_copy,
                               meter=meter, progress=progress)
    finally:
        meter.close()
        backend.close()
    out = Console()
    bmax = max(batches)
    t = Table(title=f"{result.model} | KV {result.kv_type} | {bmax}-agent speedup ({result.source})")
    for col in table_columns(result):
        t.add_column(col)
    for row in table_rows(result):
        t.add_row(*row)
    out.print(t)
    out.print(crossover_note(result) + " (modeled)")
    bm = result.byte_model()
    if bm.source:
        out.print(f"bytes: {bm.source}" + "".join(f"; {n}" for n in bm.notes))
    if result.fit_rms_relative_error is not None:
        med = result.fit_median_relative_error
        out.print("calibrated step-time model (piecewise in the batch, per KV type): "
                  + (f"median error {med:.1%}, " if med is not None else "")
                  + f"rms {result.fit_rms_relative_error:.1%} over the grid (modeled vs {result.source})")
    erows = energy_rows(result)
    if not erows:
        out.print(f"energy: {meter.reason}")
    if erows:
        et = Table(title="energy ledger")
        for col in ("batch", "context", "tok/s", "watts", "J/token", "tokens/J", "power"):
            et.add_column(col)
        for row in erows:
            et.add_row(*row)
        out.print(et)
    if result.copy_check:
        cc = result.copy_check
        out.print(f"copied vs separately prefilled caches at B={cc['batch']}, L={cc['context']}: "
                  f"{cc['copied_seconds_per_step'] * 1e3:.2f} ms vs {cc['separate_seconds_per_step'] * 1e3:.2f} ms "
                  f"per step (ratio {cc['ratio']:.3f})")
    if args.json_path:
        Path(args.json_path).write_text(result.to_json())
    if args.png_path:
        write_png(result, Path(args.png_path))
    return 0


def _dashboard(source) -> int:
    """The dashboard on a ready source (it owns the source from here and closes it)."""
    try:
        from swarmtune.tui.app import run_app
    except ImportError as e:
        source.close()
        raise UserError(f"the dashboard needs textual ({e}); 'swarmtune record' runs headless") from None
    return run_app(source)


def cmd_tune(args: argparse.Namespace) -> int:
    """Headless: the engine with its tuner on for --duration, then the setting it holds, as engine flags."""
    from swarmtune.engine.engine_flags import engine_flags
    from swarmtune.engine.tuner import Tally

    args.autotune = args.autotune or "tokens_per_s"
    if args.duration is not None and args.duration <= 0:
        raise UserError(f"--duration must be positive (got {args.duration})")
    if args.json_path and args.json_path != "-" and not Path(args.json_path).parent.exists():
        raise UserError(f"cannot write {args.json_path}: folder {Path(args.json_path).parent} does not exist")
    e = make_engine(args)
    duration = args.duration or (600.0 if e.backend.source == "simulated" else 120.0)
    e.tuner.goal = replace(e.tuner.goal, run_s=duration)
    flag = _stop_on_signals()
    decisions, whole, last = [], Tally(), []
    say = (lambda *a: print(*a, file=sys.stderr)) if args.json_path == "-" else print
    try:
        e.start()
        while e.now_s() < duration and not flag["stop"]:
            r = e.step()
            whole.add(r)
            last.append(r)
            if r.kind == "tune":
                decisions.append(r.tune | {"t": r.t})
                say(f"{r.t:8.1f} s  {r.note}")
    except KeyboardInterrupt:
        pass
    finally:
        st = e.state()
        tail = Tally()
        for r in last:
            if r.t >= e.now_s() - e.tuner.goal.dwell_s:
                tail.add(r)
        f = e.facts
        prof = getattr(e.backend, "profile", None)
        flags = engine_flags(st.batch_cap, st.kv, st.residency, e.s.ctx_per_agent, f.bytes_model, f.weight_bytes,
                             e.s.kv_budget_bytes, getattr(prof, "device_memory_bytes", None))
        source = e.backend.source
        run_s = e.now_s()  # the engine's clock: the tuner's probe and first look, before the first step, count
        e.close()
    result = {
        "objective": e.tuner.goal.objective, "setting": {"batch_cap": st.batch_cap, "kv": st.kv,
                                                         "residency": st.residency},
        "tuned_for_s": round(e.now_s(), 1), "clock": "simulated" if source == "simulated" else "wall",
        "tokens_per_s": {"whole_run": round(whole.tokens / run_s, 2) if run_s > 0 else None,
                         "last_dwell": round(tail.tokens / tail.seconds, 2) if tail.seconds else None,
                         "source": source},
        "decisions": decisions, "engines": [x.as_dict() for x in flags],
    }
    say(f"best setting: cap {st.batch_cap}, KV {st.kv}, residency {st.residency} "
        f"({result['tokens_per_s']['whole_run']} tok/s over the run, {source})")
    for x in flags:
        say(f"  {x.engine:12} {' '.join(x.flags)}")
        for n in x.notes:
            say(f"  {'':12} {n}")
    if args.json_path:
        text = json.dumps(result, indent=2)
        if args.json_path == "-":
            print(text)
        else:
            Path(args.json_path).write_text(text + "\n", encoding="utf-8")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from swarmtune.engine.sources.live import LiveSource

    return _dashboard(LiveSource(make_engine(args)))


def _check_can_listen(host: str, port: int) -> None:
    """Fail before the model loads, in one line, if the address is taken or not ours."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            raise UserError(f"cannot listen on {host}:{port}: {e.strerror}") from None


def cmd_serve(args: argparse.Namespace) -> int:
    import threading

    import uvicorn

    from swarmtune.engine.server.runner import EngineRunner
    from swarmtune.engine.server.server import is_loopback, make_app

    token = args.token or os.environ.get("SWARMTUNE_TOKEN") or None
    if not is_loopback(args.host) and not token:
        raise UserError(f"binding {args.host} (not loopback) needs a token: --token T or SWARMTUNE_TOKEN")
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port must be between 0 and 65535 (got {args.port})")
    _check_can_listen(args.host, args.port)
    engine = make_engine(args)
    runner = EngineRunner(engine)
    app = make_app(runner, token)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning",
                                           timeout_graceful_shutdown=3))

    def announce() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.05)
        if server.started:
            host, port = server.servers[0].sockets[0].getsockname()[:2]
            print(f"serving http://{host}:{port} (auth: {'bearer token' if token else 'none, loopback only'})",
                  file=sys.stderr, flush=True)

    threading.Thread(target=announce, daemon=True).start()
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal to the handler it
    # found installed: make that one a no-op, so a clean stop exits 0 rather than dying by the signal
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: None)
    server.run()  # uvicorn stops cleanly on SIGINT and SIGTERM; the lifespan stops the engine
    if not server.started:
        runner.stop()
        raise UserError(f"could not listen on {args.host}:{args.port}")
    return 0


def cmd_attach(args: argparse.Namespace) -> int:
    return _dashboard(remote_source(args))


def cmd_replay(args: argparse.Namespace) -> int:
    from swarmtune.engine.records import read_recording

    if args.speed <= 0:
        raise UserError(f"--speed must be positive (got {args.speed})")
    from swarmtune.engine.sources.replay import ReplaySource

    rec = read_recording(args.file)  # bad files fail here, before the screen is taken
    if not rec.steps:
        raise UserError(f"{args.file}: the recording has no steps")
    return _dashboard(ReplaySource(rec, args.speed))


COMMANDS = {
    "run": cmd_run, "tune": cmd_tune, "record": cmd_record, "replay": cmd_replay, "sweep": cmd_sweep,
    "profiles": cmd_profiles, "power": cmd_power, "serve": cmd_serve, "attach": cmd_attach,
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        argv = ["run", *argv]
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except UserError as e:
        print(f"swarmtune: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # a bug, not bad input: still one line, the traceback only on request
        if os.environ.get("SWARMTUNE_DEBUG"):
            raise
        print(f"swarmtune: internal error: {type(e).__name__}: {e} (SWARMTUNE_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        return 1


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()

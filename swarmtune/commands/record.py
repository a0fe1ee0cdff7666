"""`swarmtune record`: a live or remote engine headless, one JSON line per step."""

import argparse
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from swarmtune.engine.errors import UserError
from swarmtune.factories import make_engine, remote_source


@dataclass
class _Progress:
    """What the progress line shows of a recording."""

    t0: float
    n: int = 0
    decoded: int = 0
    status: str = ""


def stop_on_signals() -> dict[str, bool]:
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

    from swarmtune.engine.record.records import RecordWriter, remove_quietly
    from swarmtune.sources.live import LiveSource
    from swarmtune.sources.protocol import Sink

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
    flag = stop_on_signals()
    total = args.steps
    cols = [TextColumn("[bold]recording"), BarColumn(), TextColumn("{task.completed} steps"),
            TextColumn("{task.fields[rate]}"), TimeElapsedColumn()]
    state = _Progress(t0=time.perf_counter())

    def done() -> bool:
        if flag["stop"] or (total is not None and state.n >= total):
            return True
        return args.duration is not None and time.perf_counter() - state.t0 >= args.duration

    try:
        with Progress(*cols, console=console, transient=False) as prog:
            task = prog.add_task("rec", total=total or args.duration, rate="")

            def on_header(h: dict) -> None:
                if not writer.opened:  # a remote engine that restarted sends its header again
                    writer.open({**h, **attached})
                    state.t0 = time.perf_counter()

            def on_records(recs) -> None:
                for r in recs:
                    if done():
                        return
                    writer.write(r)
                    state.n += 1
                    state.decoded += r.tokens if r.kind == "decode" else 0
                if source.status != state.status:  # a link's state: said once, when it changes
                    state.status = source.status
                    if source.status:
                        prog.console.print(source.status)
                elapsed = time.perf_counter() - state.t0
                if state.n % 8 == 0 or total is not None:
                    shown = state.n if total is not None else min(elapsed, args.duration or elapsed)
                    prog.update(task, completed=shown, rate=f"{state.decoded / max(elapsed, 1e-9):.1f} tok/s")

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
    console.print(f"wrote {state.n} steps to {out}")
    return 0

"""`swarmtune sweep`: decode throughput over batch sizes x contexts."""

import argparse
from pathlib import Path

from swarmtune.engine.errors import UserError
from swarmtune.factories import make_backend


def cmd_sweep(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from swarmtune.engine.measure.sweep import (
        CPU_DEFAULT_BATCHES,
        CPU_DEFAULT_CONTEXTS,
        crossover_note,
        energy_rows,
        run_sweep,
        table_columns,
        table_rows,
        write_png,
    )
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
    from swarmtune.engine.measure.power.meter import make_meter

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

"""`swarmtune quality`: what each KV setting does to the next-token distribution, against f16/f16."""

import argparse
import json
import platform
import sys
import time
from pathlib import Path

from swarmtune.engine.errors import UserError

DEFAULT_CONTEXTS = (512, 1024)


def cmd_quality(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from swarmtune.engine.quality import kv_quality, quality_texts

    settings = list(args.kv_settings)  # read by the parser (a bad one, or none, was its one line)
    contexts = kv_quality.check_contexts(args.contexts or DEFAULT_CONTEXTS)
    if args.json_path and args.json_path != "-" and not Path(args.json_path).parent.exists():
        raise UserError(f"cannot write {args.json_path}: folder {Path(args.json_path).parent} does not exist")
    # the input is read and checked before the model loads
    text = quality_texts.read_text(args.text) if args.text else None
    convs = quality_texts.read_transcript(args.transcript) if args.transcript else None
    from swarmtune.factories import make_backend

    backend = make_backend(args)
    try:
        limit = backend.facts.n_ctx_train
        if limit and max(contexts) > limit:
            raise UserError(f"context {max(contexts)} exceeds the model's trained context ({limit})")
        if text is not None:
            docs, on = [backend.text.tokenize(text)], f"the text {args.text}"
        elif convs is not None:
            docs = quality_texts.conversation_documents(backend, convs)
            on = f"the transcript {args.transcript} ({len(docs)} conversations)"
        else:
            docs = quality_texts.swarm_documents(backend, args.windows, max(contexts), seed=args.seed)
            on = f"{len(docs)} histories like the synthetic swarm's (system prompt, task, Python source)"
        console = Console(stderr=True)
        t0 = time.perf_counter()
        with console.status("measuring...") as status:
            done = {"n": 0}

            def progress(n_ctx: int) -> None:
                done["n"] += 1
                status.update(f"measuring: window {done['n']} (context {n_ctx})")

            figs = kv_quality.measure(backend, docs, settings, contexts, bos=backend.text.bos_token(),
                                      max_windows=args.windows, progress=progress)
        wall_s = time.perf_counter() - t0
    finally:
        backend.close()
    model = Path(backend.facts.path).name
    machine = f"{platform.processor() or platform.machine()}, {backend.n_threads} threads"
    if args.json_path:
        doc = {"model": model, "machine": machine, "on": on, "reference": "f16/f16",
               "settings": [s.label for s in settings],
               "contexts": contexts, "wall_s": round(wall_s, 2),
               "source": "measured: teacher-forced logits against an f16/f16 cache, llama-perplexity's windows",
               "figures": [f.to_json() for f in figs]}
        text = json.dumps(doc, indent=1)
        if args.json_path == "-":
            print(text)
            return 0
        Path(args.json_path).write_text(text + "\n", encoding="utf-8")
    t = Table(title=f"{model} | KV quality against f16/f16 (measured) | {on}")
    for col in ("setting", "contexts", "mean KL (nats)", "p99 KL", "top-1 same", "positions"):
        t.add_column(col, justify="left" if col == "setting" else "right")
    for f in figs:
        if f.mean_kl is None or f.p99_kl is None or f.top1_same is None:
            t.add_row(f.setting.label, f"{f.band[0]}-{f.band[1]}", "too few positions", "", "", str(f.positions))
        else:
            t.add_row(f.setting.label, f"{f.band[0]}-{f.band[1]}", f"{f.mean_kl:.5f}", f"{f.p99_kl:.4f}",
                      f"{f.top1_same:.1%}", str(f.positions))
    out = Console(file=sys.stdout)
    out.print(t)
    out.print(f"{len(figs)} figures in {wall_s:.1f} s on {machine}")
    return 0

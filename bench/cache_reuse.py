"""What agents' habits cost the cache, on swarmtune and on llama-server, the same seeded traces on both:
prompt tokens prefilled and time to first token per turn.

Four servers, each started fresh, the traces of tests/agent_traces.py replayed one turn at a time:
swarmtune with chunk reuse (--cache-reuse, its default), swarmtune with its prefix and copies only
(--cache-reuse 0), llama-server with --cache-reuse 256 (what users are told to set) and llama-server as it
comes. Both servers get the same batch sizes (256), cache type, threads and sequences (-np = --agents), flash
attention on, repacking off; llama-server's other settings are its defaults. The assistant turns are
scripted, so both sides get the same prompts; the prompt tokens each side counted are printed, and the
difference between them (the two render an Anthropic system prompt's blocks differently) is printed too.
At least three rounds, the servers' order rotated each round; the prefill counts come from the servers'
own answers (swarmtune's account object, llama-server's timings.prompt_n and Anthropic usage).

Then, in-process on the same model and prompts, what the kept chunks cost in quality: the next-token
distribution over the 16 tokens after each prompt, from the cache chunk reuse builds against a full prefill
(KL in nats, the share of top tokens unchanged), beside the tokens they saved.

    python bench/cache_reuse.py            # builds llama-server first where missing (~11 min)

Last lines: `prefill ratio vs llama-server --cache-reuse: X` (swarmtune's prefilled tokens over
llama-server's, every turn of every trace) and the first-turn-excluded TTFT ratio beside it."""

import argparse
import random
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]

from llama_tools import engine_buffer_flags, tool_settings_line  # noqa: E402
from serve_vs_llama_server import BATCH, build_llama_server, free_port, launch, stop  # noqa: E402

from swarmtune.engine.conversation.chunk_reuse import DEFAULT_MIN_TOKENS, plan  # noqa: E402
from swarmtune.engine.kv.types import KVSetting  # noqa: E402
from tests.agent_traces import TRACES, TraceTurn, TurnResult, replay  # noqa: E402

KV = KVSetting.parse  # a KV setting as a flag spells it

SERVERS = ("swarmtune", "swarmtune --cache-reuse 0", "llama-server --cache-reuse 256", "llama-server")
KL_TOKENS = 16  # positions scored after each prompt


def traces(seed: int) -> dict[str, list[TraceTurn]]:
    """The traces at this bench's scale: Claude Code's system prompt is thousands of tokens, as the real one."""
    out = {name: fn(seed) for name, fn in TRACES.items()}
    out["claude-code"] = TRACES["claude-code"](seed, files=133, notes=True)
    return out


def start(name: str, a: argparse.Namespace, model: str, llama_server: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    if name.startswith("swarmtune"):
        cmd = [sys.executable, "-m", "swarmtune", "serve", "--clients", "--port", str(port), "--agents",
               str(a.agents), "--ctx", str(a.ctx), "--kv", "f16", "--threads", str(a.threads)]
        if name.endswith("0"):
            cmd += ["--cache-reuse", "0"]
    else:
        cmd = [llama_server, "-m", model, "--port", str(port), "-np", str(a.agents), "-c", str(a.agents * a.ctx),
               "-ctk", "f16", "-ctv", "f16", "-t", str(a.threads), "-fa", "on", *engine_buffer_flags(), "--no-webui",
               "-b", str(BATCH), "-ub", str(BATCH)]
        if name.endswith("256"):
            cmd += ["--cache-reuse", "256"]
    return launch(cmd, port)


def run_server(name: str, a: argparse.Namespace, model: str, llama_server: str,
               all_traces: dict[str, list[TraceTurn]]) -> dict[str, list[TurnResult]]:
    proc, url = start(name, a, model, llama_server)
    try:
        return {t: replay(url, turns, max_tokens=a.gen_tokens) for t, turns in all_traces.items()}
    finally:
        stop(proc)


def kl_cost(all_traces: dict[str, list[TraceTurn]], threads: int) -> list[tuple[str, int, int, float, float, float]]:
    """Per turn with kept chunks: (trace, tokens kept, prompt tokens, mean KL, max KL, top-1 kept share)."""
    from swarmtune.engine.agents.prompt import PromptRenderer
    from swarmtune.engine.backends.llama_backend import LlamaBackend
    from swarmtune.engine.model.default_model import default_model_path
    from swarmtune.engine.model.model_facts import read_model_facts
    from swarmtune.engine.quality.kv_quality import kl_and_top1

    b = LlamaBackend(read_model_facts(default_model_path()), n_threads=threads)
    fresh = LlamaBackend(read_model_facts(default_model_path()), n_threads=threads)
    render = PromptRenderer(b)
    out = []
    try:
        for name, turns in all_traces.items():
            held: dict[str, list[int]] = {}
            for t in turns:
                prompt = b.text.tokenize(render.render(_messages(t)))
                old = held.get(t.conversation)
                held[t.conversation] = prompt
                if old is None:
                    continue
                keep = next((i for i, (x, y) in enumerate(zip(old, prompt, strict=False)) if x != y),
                            min(len(old), len(prompt)))
                keep = min(keep, len(prompt) - 1)
                chunks = plan(old, prompt, keep, DEFAULT_MIN_TOKENS)
                if not chunks:
                    continue
                n_ctx = len(old) + len(prompt) + KL_TOKENS + 64
                b.open(KV("f16"), 1, n_ctx)
                _fill(b, old, 0)
                kept = b.cells.cut(0, keep, chunks)
                at = keep
                for c, k in zip(chunks, kept, strict=True):
                    _fill(b, prompt[at : c.prompt_at], at)
                    b.cells.paste(0, k, c.prompt_at)
                    at = c.prompt_at + c.tokens
                _fill(b, prompt[at:-1], at)
                fresh.open(KV("f16"), 1, n_ctx)
                _fill(fresh, prompt[:-1], 0)
                ref, followed = _follow(fresh, prompt, None)
                got, _ = _follow(b, prompt, followed)
                kl, same = kl_and_top1(ref, got)
                out.append((name, sum(c.tokens for c in chunks), len(prompt), float(kl.mean()), float(kl.max()),
                            float(same.mean())))
    finally:
        b.close()
        fresh.close()
    return out


def _follow(b, prompt: list[int], forced: list[int] | None) -> tuple[np.ndarray, list[int]]:
    """The logits at the prompt's last token and the KL_TOKENS - 1 after it: greedy where forced is None,
    else those tokens fed (the reference's continuation, so both caches are scored on the same text)."""
    rows, tokens, tok, pos = [], [], prompt[-1], len(prompt) - 1
    for i in range(KL_TOKENS):
        row = b.steps.next_logits(0, tok, pos)
        rows.append(row)
        b.steps.prefill(0, [tok], pos)
        tok, pos = (forced[i] if forced is not None else int(row.argmax())), pos + 1
        tokens.append(tok)
    return np.stack(rows), tokens


def paste_cost(threads: int, contexts: tuple[int, ...] = (512, 1024, 2048, 3072)) -> list[tuple[int, float, float]]:
    """Per context: (cells, seconds to cut and paste back one 64-token chunk there, seconds to prefill those
    64 tokens there instead): the break-even length of a kept chunk, which --cache-reuse's default follows."""
    from swarmtune.engine.backends.llama_backend import LlamaBackend
    from swarmtune.engine.conversation.chunk_reuse import Chunk
    from swarmtune.engine.model.default_model import default_model_path
    from swarmtune.engine.model.model_facts import read_model_facts
    from tests.agent_traces import tool_output

    b = LlamaBackend(read_model_facts(default_model_path()), n_threads=threads)
    text = b.text.tokenize(" ".join(tool_output(random.Random(i), 4000) for i in range(8)))
    out = []
    try:
        for n in contexts:
            toks = text[:n]
            b.open(KV("f16"), 1, n + 128)
            _fill(b, toks, 0)
            t0 = time.perf_counter()
            (k,) = b.cells.cut(0, n - 64, [Chunk(n - 64, n - 64 - 8, 64)])  # 8 tokens removed before it
            b.cells.paste(0, k, n - 72)
            paste_s = time.perf_counter() - t0
            b.cells.truncate(0, n - 72)
            t0 = time.perf_counter()
            b.steps.prefill(0, toks[n - 64 :], n - 72)
            out.append((n, paste_s, time.perf_counter() - t0))
    finally:
        b.close()
    return out


def _fill(b, tokens: list[int], at: int) -> None:
    for i in range(0, len(tokens), b.max_chunk_tokens):
        b.steps.prefill(0, tokens[i : i + b.max_chunk_tokens], at + i)


def _messages(t: TraceTurn) -> list[dict]:
    """A turn's messages as swarmtune renders them (an Anthropic system's blocks joined, as its API does)."""
    msgs = list(t.body["messages"])
    system = t.body.get("system")
    if system is not None:
        msgs = [{"role": "system", "content": "".join(b["text"] for b in system)}] + msgs
    return msgs


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--agents", type=int, default=4)
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--gen-tokens", type=int, default=8, help="tokens generated a turn (the reply is scripted)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--llama-server", default=None, help="the binary (default: built by bench/build_llama_server.sh)")
    p.add_argument("--no-kl", action="store_true", help="skip the in-process quality measure")
    a = p.parse_args()
    if a.rounds < 3:
        p.error("--rounds must be at least 3 (the spread needs them)")
    from swarmtune.engine.model.default_model import default_model_path

    model = str(default_model_path())
    llama_server = a.llama_server or build_llama_server()
    all_traces = traces(a.seed)
    print(f"traces: {', '.join(f'{n} ({len(t)} turns)' for n, t in all_traces.items())}; seed {a.seed}; "
          f"{a.agents} sequences of {a.ctx}; f16 KV; batch {BATCH}/{BATCH}; {a.threads} threads; "
          f"swarmtune --cache-reuse default {DEFAULT_MIN_TOKENS}", flush=True)
    print(tool_settings_line(), flush=True)
    runs: dict[str, list[dict[str, list[TurnResult]]]] = defaultdict(list)
    for r in range(a.rounds):
        order = SERVERS[r % len(SERVERS):] + SERVERS[: r % len(SERVERS)]
        for name in order:
            t0 = time.perf_counter()
            runs[name].append(run_server(name, a, model, llama_server, all_traces))
            print(f"round {r + 1}: {name} in {time.perf_counter() - t0:.0f} s", flush=True)

    first = {n: runs[n][0] for n in SERVERS}
    for trace in all_traces:
        print(f"\n{trace}: turn, then per server prompt tokens / prefilled")
        for i in range(len(all_traces[trace])):
            cells = "  ".join(f"{first[n][trace][i].prompt_tokens:5d}/{first[n][trace][i].prefilled_tokens:5d}"
                              for n in SERVERS)
            print(f"  {i + 1:2d} {all_traces[trace][i].conversation:12s} {cells}")
    print("\nservers:", " | ".join(SERVERS))
    totals = {n: sum(t.prefilled_tokens for tr in first[n].values() for t in tr) for n in SERVERS}
    prompts = {n: sum(t.prompt_tokens for tr in first[n].values() for t in tr) for n in SERVERS}
    for n in SERVERS:
        later = [t for tr in first[n].values() for t in tr[1:]]
        print(f"{n:32s} prompt tokens {prompts[n]:7,d}  prefilled {totals[n]:7,d} ({totals[n] / prompts[n]:.1%}); "
              f"turns after the first: {sum(t.prefilled_tokens for t in later):,} of "
              f"{sum(t.prompt_tokens for t in later):,}")
    gap = prompts["swarmtune"] / prompts["llama-server"] - 1
    print(f"prompt tokens differ by {gap:+.2%} (swarmtune over llama-server: how each renders the prompts)")
    cc = [t for t in first["swarmtune"]["claude-code"][1:]]
    share = sum(t.prefilled_tokens for t in cc) / sum(t.prompt_tokens for t in cc)
    print(f"claude-code from turn 2: swarmtune prefills {share:.1%} of the prompt tokens (bar < 10%)")
    for n, paste_s, prefill_s in paste_cost(a.threads):
        print(f"at {n:,} cells: cutting and pasting a 64-token chunk took {paste_s:.3f} s, prefilling it "
              f"{prefill_s:.3f} s (break-even chunk {64 * paste_s / prefill_s:.0f} tokens)")
    if not a.no_kl:
        cost = kl_cost(all_traces, a.threads)
        for trace in all_traces:
            rows = [c for c in cost if c[0] == trace]
            if rows:
                print(f"quality of kept chunks, {trace}: {sum(r[1] for r in rows):,} tokens kept over {len(rows)} "
                      f"turns; next-token KL vs full prefill mean {statistics.mean(r[3] for r in rows):.4f} nats "
                      f"(worst position {max(r[4] for r in rows):.4f}), top token kept "
                      f"{statistics.mean(r[5] for r in rows):.1%} ({KL_TOKENS} positions a turn)")
    ttft = []
    for ours, theirs in zip(runs["swarmtune"], runs["llama-server --cache-reuse 256"], strict=True):
        o = [t.ttft_s for tr in ours.values() for t in tr[1:]]
        th = [t.ttft_s for tr in theirs.values() for t in tr[1:]]
        ttft.append(sum(o) / sum(th))
    ratio = totals["swarmtune"] / totals["llama-server --cache-reuse 256"]
    print(f"TTFT ratio vs llama-server --cache-reuse (turn 1 excluded, summed, per round): {spread(ttft)}")
    print(f"prefill ratio vs llama-server --cache-reuse: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

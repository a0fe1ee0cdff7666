"""One long prompt against agents that are decoding: how long the decoding agents wait between tokens while it
is prefilled, and how long the newcomer waits for its first token, on swarmtune with and without a stall bound
and on llama-server at its default batch and at a large one.

Each run starts its server fresh (no prompt cache carried between runs), opens 7 streaming conversations that
decode (a short prompt each, `max_tokens` past the run's end, `ignore_eos`, greedy), waits until every one has
streamed for a second, then sends the 8th: a prompt of --prompt-tokens tokens (16,384 where the model takes
it; otherwise the longest it takes, its training context less the reply and the chat template) asking for 16
tokens. What is timed is what a client sees, each content chunk's arrival on the socket:
- the decoding streams' inter-token gaps that end between the newcomer's send and a second after its first
  token (the stall window), p50 and p99 over the 7 streams together;
- the newcomer's time to first token, from its send to its first content byte.

Sides, the same prompts on each (a round's prompts differ from the last round's), in an order reversed each
round (A B C D, D C B A, ...), --rounds rounds:
- swarmtune --max-stall-ms auto (bounded) and --max-stall-ms off (whole 256-token chunks between decode steps);
- llama-server -np 8 at its default -b/-ub (2048/512) and at --large-b (every prompt token in one batch).
Both load the same model with the same llama.cpp, the same context per conversation, KV type, threads, flash
attention and weight buffers.

Last lines: `stall p99 vs llama-server: X (lo-hi)` (the bounded side's decoding p99 gap over llama-server's at
its default -b, the median of the rounds' ratios and their range) and `ttft vs unbounded: X (lo-hi)` (the
bounded side's newcomer TTFT over the unbounded side's).

    python bench/prefill_stall.py                   # builds llama-server first where missing (~11 min)
    python bench/prefill_stall.py --prompt-tokens 2048 --rounds 3   # a quicker look
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE)]

from llama_tools import build_tool, engine_buffer_flags, tool_settings_line  # noqa: E402
from serve_vs_llama_server import free_port, launch, stdlib_text, stop  # noqa: E402

DECODERS = 7
NEWCOMER_TOKENS = 16  # what the newcomer asks for
TEMPLATE_ROOM = 64  # the chat template's tokens around the newcomer's text, and a margin
SETTLE_S = 1.0  # every decoder streams this long before the newcomer is sent
AFTER_S = 1.0  # the window runs on this long after the newcomer's first token
SIDES = ("swarmtune bounded", "swarmtune unbounded", "llama-server -b default", "llama-server -b large")


@dataclass
class Run:
    side: str
    ttft_s: float
    gaps_s: list[float] = field(default_factory=list)  # the decoding streams' gaps in the stall window
    decoded: int = 0  # content chunks the decoders streamed in the window

    def gap(self, q: float) -> float:
        xs = sorted(self.gaps_s)
        return xs[min(len(xs) - 1, max(0, int(q * len(xs) + 0.999999) - 1))] if xs else float("nan")


def prompt_text(tokenize, tokens: int, round_no: int) -> str:
    """About `tokens` tokens of the standard library's source, from a place of its own each round."""
    corpus = stdlib_text()
    start = (round_no * 7919 * 13) % (len(corpus) // 2)
    text = corpus[start : start + tokens * 6]
    ids = tokenize(text)
    while len(ids) > tokens:  # cut to the count (a cut may merge tokens at its edge: count again)
        text = text[: int(len(text) * tokens / len(ids)) - 1]
        ids = tokenize(text)
    return "Summarize what this code does.\n\n" + text


async def stream(http: httpx.AsyncClient, body: dict, arrivals: list[float], first: asyncio.Event | None) -> None:
    async with http.stream("POST", "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            c = json.loads(line[6:])
            if c.get("choices") and c["choices"][0].get("delta", {}).get("content"):
                arrivals.append(time.perf_counter())
                if first is not None:
                    first.set()


async def one_run(url: str, side: str, newcomer: str, ctx: int) -> Run:
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(900.0)) as http:
        streams: list[list[float]] = [[] for _ in range(DECODERS)]
        started = [asyncio.Event() for _ in range(DECODERS)]
        tasks = []
        for i in range(DECODERS):
            body = {"model": "m", "messages": [{"role": "user", "content": f"Agent {i}: write a long story about a "
                                                                          f"robot named R{i}, chapter by chapter."}],
                    "max_tokens": ctx // 2, "ignore_eos": True, "temperature": 0, "seed": i, "stream": True,
                    "user": f"decoder-{i}"}
            tasks.append(asyncio.create_task(stream(http, body, streams[i], started[i])))
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 600)
        await asyncio.sleep(SETTLE_S)
        body = {"model": "m", "messages": [{"role": "user", "content": newcomer}], "max_tokens": NEWCOMER_TOKENS,
                "ignore_eos": True, "temperature": 0, "stream": True, "user": "newcomer"}
        mine: list[float] = []
        t_send = time.perf_counter()
        newcomer_task = asyncio.create_task(stream(http, body, mine, None))
        while not mine:
            if newcomer_task.done():
                newcomer_task.result()  # its error, said
                raise SystemExit(f"{side}: the newcomer got no token")
            if any(t.done() for t in tasks):
                for t in tasks:
                    if t.done():
                        t.result()
                raise SystemExit(f"{side}: a decoding stream ended before the newcomer's first token; raise its "
                                 "max_tokens or shorten --prompt-tokens")
            await asyncio.sleep(0.002)
        ttft = mine[0] - t_send
        await asyncio.sleep(AFTER_S)
        end = time.perf_counter()
        for t in [*tasks, newcomer_task]:
            t.cancel()
        await asyncio.gather(*tasks, newcomer_task, return_exceptions=True)
    run = Run(side, ttft)
    for arr in streams:
        for a, b in zip(arr, arr[1:], strict=False):
            if t_send < b <= end:
                run.gaps_s.append(b - a)
                run.decoded += 1
    return run


def start(side: str, a: argparse.Namespace, model: str, llama_server: str | None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    agents = DECODERS + 1
    if side.startswith("swarmtune"):
        cmd = [sys.executable, "-m", "swarmtune", "serve", "--clients", "--port", str(port), "--agents", str(agents),
               "--ctx", str(a.ctx), "--kv", a.kv, "--threads", str(a.threads),
               "--max-stall-ms", "auto" if side == "swarmtune bounded" else "off"]
    else:
        assert llama_server is not None
        batch = [] if side.endswith("default") else ["-b", str(a.large_b)]
        cmd = [llama_server, "-m", model, "--port", str(port), "-np", str(agents), "-c", str(agents * a.ctx),
               "-ctk", a.kv, "-ctv", a.kv, "-t", str(a.threads), "-fa", "on", *engine_buffer_flags(), "--no-webui",
               *batch]
    return launch(cmd, port)


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompt-tokens", type=int, default=16384, help="the newcomer's prompt (cut to the model's)")
    p.add_argument("--large-b", type=int, default=16384, help="llama-server's large -b (its -ub stays 512)")
    p.add_argument("--kv", default="f16")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES)
    p.add_argument("--llama-server", default=None, help="the binary (default: built by bench/build_llama_server.sh)")
    a = p.parse_args()
    if a.rounds < 3:
        p.error("--rounds must be at least 3: fewer cannot show the spread")
    from llama_cpp import Llama

    from swarmtune.engine.model.default_model import default_model_path

    model = str(default_model_path())
    vocab = Llama(model_path=model, vocab_only=True, verbose=False)
    train_ctx = int(vocab.metadata.get("llama.context_length", a.prompt_tokens + 1024))
    tokens = min(a.prompt_tokens, train_ctx - NEWCOMER_TOKENS - TEMPLATE_ROOM)
    # a conversation's context: the newcomer's prompt and reply, and no less than the decoders' turns need
    a.ctx = train_ctx if tokens < a.prompt_tokens else max(1024, a.prompt_tokens + NEWCOMER_TOKENS + TEMPLATE_ROOM)
    def tokenize(text: str) -> list[int]:
        return vocab.tokenize(text.encode(), add_bos=False)
    llama_server = a.llama_server or (build_tool("llama-server") if any(s.startswith("llama") for s in a.sides)
                                      else None)
    print(f"machine: {os.cpu_count()} CPUs; model {Path(model).name} (trained to {train_ctx} tokens); "
          f"{DECODERS} decoding streams and a newcomer of {tokens:,} prompt tokens"
          + (f" (asked {a.prompt_tokens:,}: the model's limit)" if tokens < a.prompt_tokens else "")
          + f"; --ctx {a.ctx} a conversation, KV {a.kv}, {a.threads} threads", flush=True)
    print(f"swarmtune: 256-token chunks, one between two decode steps; llama-server -np {DECODERS + 1} "
          f"-c {(DECODERS + 1) * a.ctx} -fa on, -b 2048 -ub 512 (its defaults) or -b {a.large_b}", flush=True)
    print(tool_settings_line(), flush=True)
    runs: dict[str, list[Run]] = {s: [] for s in a.sides}
    for r in range(a.rounds):
        newcomer = prompt_text(tokenize, tokens, r)
        for side in (a.sides if r % 2 == 0 else a.sides[::-1]):
            proc, url = start(side, a, model, llama_server)
            try:
                run = asyncio.run(one_run(url, side, newcomer, a.ctx))
            finally:
                stop(proc)
            runs[side].append(run)
            print(f"  round {r + 1} {side:24s} decoding gap p50 {run.gap(0.5) * 1000:7.1f} ms, p99 "
                  f"{run.gap(0.99) * 1000:8.1f} ms, longest {max(run.gaps_s, default=0) * 1000:8.1f} ms over "
                  f"{run.decoded} tokens; newcomer TTFT {run.ttft_s:7.2f} s", flush=True)
    med = statistics.median
    print(f"{'side':24s} {'gap p50 ms':>11s} {'gap p99 ms':>11s} {'TTFT s':>8s}   (medians of {a.rounds} rounds)")
    for side, rs in runs.items():
        print(f"{side:24s} {med(x.gap(0.5) for x in rs) * 1000:11.1f} {med(x.gap(0.99) for x in rs) * 1000:11.1f} "
              f"{med(x.ttft_s for x in rs):8.2f}")
    b, u, d = "swarmtune bounded", "swarmtune unbounded", "llama-server -b default"
    if b in runs and d in runs:
        ratios = [x.gap(0.99) / y.gap(0.99) for x, y in zip(runs[b], runs[d], strict=True)]
        print(f"stall p99 vs llama-server: {spread(ratios)}")
    if b in runs and u in runs:
        ratios = [x.ttft_s / y.ttft_s for x, y in zip(runs[b], runs[u], strict=True)]
        print(f"ttft vs unbounded: {spread(ratios)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

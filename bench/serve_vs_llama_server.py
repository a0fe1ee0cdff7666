"""swarmtune serve --clients against llama.cpp's own llama-server, side by side, on one seeded client swarm.

The swarm: N concurrent conversations over real HTTP with streaming. Each turn generates exactly T tokens
(`ignore_eos`, which both servers honour: the same tokens generated on both sides), then appends a tool
result of about M tokens (a slice of Python's standard library, as the synthetic swarm's are) after a
lognormal wait, until the contexts pass 1,000 tokens. Both servers load the same model with the same
llama.cpp, the same total context (N x --ctx, split into N slots), KV type, threads, flash attention and
batch sizes (llama-server `-b`/`-ub` set to swarmtune's 256, its defaults being 2048/512); llama-server
keeps its prompt cache on, as it defaults, and its weights unrepacked (swarmtune's default: repacking
crashes AMX CPUs). The tool results and waits are the same on both sides; the replies' text differs, so
the prompt tokens each server received are printed and must agree within PROMPT_TOLERANCE.

Runs alternate, A B B A A B ... (--rounds pairs, at least 3). Prints for each run its tokens/s (completion
tokens over the swarm's wall time), then per server the median, the time to first token p50/p99 for first
and returning turns, the prompt tokens received and prefilled per turn, and the prompt tokens processed
again (prefilled beyond what each turn added). Last line: `ratio: X (lo-hi)`, the median of the paired
runs' ratios of swarmtune's tokens/s over llama-server's, and the lowest and highest of them.

    python bench/serve_vs_llama_server.py            # builds llama-server first where missing (~11 min)
"""

import argparse
import asyncio
import json
import math
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE)]

from llama_tools import build_tool, engine_buffer_flags, tool_settings_line  # noqa: E402

BATCH = 256  # swarmtune's n_batch = n_ubatch (its prefill chunk); llama-server is given the same
PROMPT_TOLERANCE = 0.02  # the two sides' prompt tokens per turn may differ by this much (their replies' text)


@dataclass
class Turn:
    first: bool
    ttft_s: float
    completion_tokens: int
    prompt_tokens: int
    processed_tokens: int  # prompt tokens the server prefilled for this turn
    added_tokens: int  # what this turn's prompt added to the last one's prompt and reply (returning turns)


@dataclass
class Run:
    server: str
    wall_s: float
    turns: list[Turn] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return sum(t.completion_tokens for t in self.turns) / self.wall_s

    def ttft(self, first: bool, q: float) -> float:
        xs = sorted(t.ttft_s for t in self.turns if t.first == first)
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")

    @property
    def reprocessed(self) -> int:
        return sum(max(0, t.processed_tokens - t.added_tokens) for t in self.turns if not t.first)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stdlib_text() -> str:
    root = Path(sysconfig.get_paths()["stdlib"])
    return "".join(p.read_text(encoding="utf-8", errors="replace") for p in sorted(root.glob("*.py"))[:40])


async def conversation(http: httpx.AsyncClient, i: int, a: argparse.Namespace, corpus: str,
                       turns: list[Turn]) -> None:
    rng = random.Random(a.seed * 1000 + i)
    msgs = [{"role": "system", "content": "You are a coding agent working in a Python repository. Read the tool "
                                          "results, reason briefly, then call the next tool or propose a patch."},
            {"role": "user", "content": f"Task {i}: find why module {i} raises on an empty input and fix it."}]
    last = 0  # the last turn's prompt and reply, tokens
    for n in range(a.turns):
        body = {"model": "m", "messages": msgs, "max_tokens": a.gen_tokens, "ignore_eos": True, "temperature": 0.7,
                "seed": a.seed + i, "stream": True, "stream_options": {"include_usage": True}}
        t0 = time.perf_counter()
        ttft, text, usage, timings = None, [], None, None
        async with http.stream("POST", "/v1/chat/completions", json=body) as r:
            r.raise_for_status()
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                c = json.loads(line[6:])
                if c.get("choices") and (d := c["choices"][0].get("delta", {}).get("content")):
                    ttft = ttft if ttft is not None else time.perf_counter() - t0
                    text.append(d)
                usage = c.get("usage") or usage
                timings = c.get("timings") or timings
        assert usage is not None, "no usage chunk"
        prompt, completion = usage["prompt_tokens"], usage["completion_tokens"]
        if timings is not None:  # llama-server: what it prefilled
            processed = timings["prompt_n"]
        else:
            processed = prompt - (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        turns.append(Turn(n == 0, ttft if ttft is not None else time.perf_counter() - t0, completion, prompt,
                          processed, prompt - last))
        last = prompt + completion
        start = rng.randrange(0, len(corpus) - a.tool_tokens * 5)
        msgs += [{"role": "assistant", "content": "".join(text)},
                 {"role": "tool", "content": "$ sed -n ...\n" + corpus[start : start + a.tool_tokens * 4]}]
        await asyncio.sleep(rng.lognormvariate(math.log(a.wait_s), 0.5))


async def swarm(url: str, a: argparse.Namespace, name: str) -> Run:
    corpus = stdlib_text()
    turns: list[Turn] = []
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        t0 = time.perf_counter()
        await asyncio.gather(*(conversation(http, i, a, corpus, turns) for i in range(a.agents)))
        return Run(name, time.perf_counter() - t0, turns)


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 300) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited ({proc.returncode}) before it was ready")
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                r = httpx.post(url + "/v1/chat/completions", timeout=120, json={
                    "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
                if r.status_code == 200:
                    return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit("the server did not get ready")


def start(name: str, a: argparse.Namespace, model: str, llama_server: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    if name == "swarmtune":
        cmd = [sys.executable, "-m", "swarmtune", "serve", "--clients", "--port", str(port), "--agents",
               str(a.agents), "--ctx", str(a.ctx), "--kv", a.kv, "--threads", str(a.threads)]
    else:
        cmd = [llama_server, "-m", model, "--port", str(port), "-np", str(a.agents), "-c", str(a.agents * a.ctx),
               "-ctk", a.kv, "-ctv", a.kv, "-t", str(a.threads), "-fa", "on", *engine_buffer_flags(), "--no-webui",
               "-b", str(BATCH), "-ub", str(BATCH)]
    return launch(cmd, port)


def launch(cmd: list[str], port: int) -> tuple[subprocess.Popen, str]:
    """A server started from cmd on port (its output dropped, the cache check off), once it answers."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, SWARMTUNE_CHECK="0"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
    except BaseException:  # not ready in time (or interrupted): the server must not outlive the bench
        stop(proc)
        raise
    return proc, url


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def build_llama_server() -> str:
    return build_tool("llama-server")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", type=int, default=8)
    p.add_argument("--turns", type=int, default=6, help="turns per conversation (contexts pass 1,000 tokens)")
    p.add_argument("--gen-tokens", type=int, default=64, help="T: the tokens every turn generates")
    p.add_argument("--tool-tokens", type=int, default=160, help="M: about this many tokens of tool result per turn")
    p.add_argument("--wait-s", type=float, default=0.5, help="the median wait between turns (lognormal, sigma 0.5)")
    p.add_argument("--ctx", type=int, default=2048, help="context per agent (llama-server: -c agents x ctx)")
    p.add_argument("--kv", default="f16")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=3, help="runs a side, alternated (at least 3)")
    p.add_argument("--first", choices=("swarmtune", "llama-server"), default="swarmtune",
                   help="the server of the first run (the order then alternates: A B, B A, A B, ...)")
    p.add_argument("--llama-server", default=None, help="the binary (default: built by bench/build_llama_server.sh)")
    a = p.parse_args()
    if a.rounds < 3:
        p.error("--rounds must be at least 3: fewer cannot show the spread")
    from swarmtune.engine.model.default_model import default_model_path

    model = str(default_model_path())
    llama_server = a.llama_server or build_llama_server()
    print(f"machine: {os.cpu_count()} CPUs; model {Path(model).name}; {a.agents} conversations x {a.turns} turns, "
          f"T={a.gen_tokens}, M~{a.tool_tokens}, wait median {a.wait_s} s; KV {a.kv}, {a.threads} threads",
          flush=True)
    print(f"batch sizes: both {BATCH}/{BATCH} (n_batch/n_ubatch); llama-server -np {a.agents} "
          f"-c {a.agents * a.ctx}; every turn generates {a.gen_tokens} tokens (ignore_eos)", flush=True)
    print(tool_settings_line(), flush=True)
    runs: dict[str, list[Run]] = {"swarmtune": [], "llama-server": []}
    ab = (a.first, "llama-server" if a.first == "swarmtune" else "swarmtune")
    order = [name for r in range(a.rounds) for name in (ab if r % 2 == 0 else ab[::-1])]
    for name in order:
        proc, url = start(name, a, model, llama_server)
        try:
            run = asyncio.run(swarm(url, a, name))
        finally:
            stop(proc)
        runs[name].append(run)
        ctx = max(t.prompt_tokens + t.completion_tokens for t in run.turns)
        print(f"  {name:12s} {run.tokens_per_s:7.2f} tok/s over {run.wall_s:5.1f} s, "
              f"{sum(t.completion_tokens for t in run.turns)} tokens generated, "
              f"{sum(t.prompt_tokens for t in run.turns)} prompt tokens (contexts up to {ctx})", flush=True)
    print(f"{'median':12s} {'tok/s':>7s} {'TTFT first p50/p99 s':>22s} {'TTFT returning p50/p99 s':>26s} "
          f"{'prompt/turn':>12s} {'prefilled/turn':>15s} {'again':>6s}")
    med = statistics.median
    for name, rs in runs.items():
        n_turns = len(rs[0].turns)
        print(f"{name:12s} {med(r.tokens_per_s for r in rs):7.2f} "
              f"{med(r.ttft(True, 0.5) for r in rs):10.3f} / {med(r.ttft(True, 0.99) for r in rs):8.3f}  "
              f"{med(r.ttft(False, 0.5) for r in rs):12.3f} / {med(r.ttft(False, 0.99) for r in rs):8.3f}  "
              f"{med(sum(t.prompt_tokens for t in r.turns) for r in rs) / n_turns:12.1f} "
              f"{med(sum(t.processed_tokens for t in r.turns) for r in rs) / n_turns:15.1f} "
              f"{med(r.reprocessed for r in rs):6.0f}")
    generated = {n: {sum(t.completion_tokens for t in r.turns) for r in rs} for n, rs in runs.items()}
    prompts = {n: med(sum(t.prompt_tokens for t in r.turns) for r in rs) for n, rs in runs.items()}
    gap = abs(prompts["swarmtune"] / prompts["llama-server"] - 1)
    print(f"tokens generated per run: swarmtune {sorted(generated['swarmtune'])}, "
          f"llama-server {sorted(generated['llama-server'])}; prompt tokens differ by {gap:.1%} "
          f"(tolerance {PROMPT_TOLERANCE:.0%})")
    ttft_ours, ttft_theirs = (med(r.ttft(False, 0.5) for r in runs[n]) for n in ("swarmtune", "llama-server"))
    print(f"returning-turn TTFT p50: swarmtune {ttft_ours:.3f} s vs llama-server {ttft_theirs:.3f} s "
          f"({'no worse' if ttft_ours <= ttft_theirs else 'worse'})")
    if len(generated["swarmtune"] | generated["llama-server"]) != 1 or gap > PROMPT_TOLERANCE:
        print("not like with like: the sides generated different token counts or received different prompts")
        return 1
    ratios = [o.tokens_per_s / t.tokens_per_s for o, t in zip(runs["swarmtune"], runs["llama-server"], strict=True)]
    print("paired runs' ratios: " + ", ".join(f"{r:.3f}" for r in ratios))
    print(f"ratio: {med(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

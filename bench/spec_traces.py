"""bench/speculation.py's served side: coding-agent traces (tests/agent_traces.py) sent to `swarmtune serve
--clients` without drafts and with `--draft auto`, and to llama-server with its n-gram speculation, the same
requests on every side.

Each of `batch` clients replays its own seeded copy of the trace, turn after turn, all at once. Every turn asks
for the same number of tokens (`max_tokens`, `ignore_eos`, greedy), so each side generates the same tokens'
count. What is timed is what a client sees: each stream from its first text byte to its last, the decode a
speculation speeds up (a turn's prefill, which the servers' caches treat differently, is left out and its
time to first token printed apart).

- edit: aider's whole-file edit format. The trace's prompt (system prompt, repository map, the added file,
  the edits so far) with each request asking for the whole file back with one change: an agent re-emitting
  a file it has in context, where n-gram drafts from its own text pay most.
- opencode: tests/agent_traces.py's opencode trace as it is (tool output read, short steps written).
"""

import json
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]

from llama_tools import engine_buffer_flags  # noqa: E402
from serve_vs_llama_server import free_port, launch, stop  # noqa: E402

from tests.agent_traces import TraceTurn, aider, opencode  # noqa: E402

# llama-server's n-gram speculation on the pinned llama.cpp (common/speculative.cpp; `--spec-type`): each
# tried on each trace in a first round, the best kept and named
LLAMA_SPEC_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
TRACES = ("edit", "opencode")


def edit_trace(seed: int, turns: int) -> list[TraceTurn]:
    """aider's trace, each request asking for the whole file back with one change (aider's `whole` format)."""
    out = []
    for n, t in enumerate(aider(seed, turns=turns)):
        msgs = [dict(m) for m in t.body["messages"]]
        msgs[-1]["content"] = (f"Change {n + 1}: add a comment line `# step {n + 1}` at the top of src/module.py. "
                               "Reply with the whole updated file, every line of it, in one fenced block.")
        out.append(TraceTurn(t.conversation, t.endpoint, {"messages": msgs}))
    return out


def trace(name: str, seed: int, turns: int) -> list[TraceTurn]:
    return edit_trace(seed, turns) if name == "edit" else opencode(seed, turns=turns)


@dataclass
class Stream:
    text: str
    tokens: int
    ttft_s: float
    decode_s: float  # first text byte to the last


@dataclass
class Run:
    streams: list[list[Stream]] = field(default_factory=list)  # per client, its turns

    @property
    def decode_tokens_per_s(self) -> float:
        """Per stream, tokens after the first over the time after it: the mean over every turn of every client."""
        rates = [(s.tokens - 1) / s.decode_s for c in self.streams for s in c if s.tokens > 1 and s.decode_s > 0]
        return statistics.fmean(rates) if rates else 0.0

    @property
    def tokens(self) -> int:
        return sum(s.tokens for c in self.streams for s in c)

    @property
    def ttft_s(self) -> float:
        return statistics.median(s.ttft_s for c in self.streams for s in c)

    def texts(self) -> list[list[str]]:
        return [[s.text for s in c] for c in self.streams]


def _client(url: str, turns: list[TraceTurn], max_tokens: int, out: list[Stream]) -> None:
    with httpx.Client(base_url=url, timeout=900, limits=httpx.Limits(max_keepalive_connections=0)) as http:
        for t in turns:
            body = {**t.body, "model": "m", "max_tokens": max_tokens, "stream": True, "temperature": 0.0,
                    "ignore_eos": True, "stream_options": {"include_usage": True}}
            t0 = time.perf_counter()
            first = last = None
            parts: list[str] = []
            usage: dict = {}
            with http.stream("POST", "/v1/chat/completions", json=body) as r:
                if r.status_code != 200:
                    raise RuntimeError(f"{r.status_code} {r.read().decode()[:300]}")
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    ev = json.loads(line[6:])
                    text = (ev.get("choices") or [{}])[0].get("delta", {}).get("content")
                    if text:
                        now = time.perf_counter()
                        first = first or now
                        last = now
                        parts.append(text)
                    usage = ev.get("usage") or usage
            first = first or time.perf_counter()
            out.append(Stream("".join(parts), int(usage.get("completion_tokens", 0)), first - t0,
                              (last or first) - first))


def run_clients(url: str, name: str, batch: int, turns: int, max_tokens: int) -> Run:
    run = Run([[] for _ in range(batch)])
    threads = [threading.Thread(target=_client, args=(url, trace(name, 100 + i, turns), max_tokens, run.streams[i]))
               for i in range(batch)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if any(len(c) != turns for c in run.streams):
        raise RuntimeError("a client's turn failed")
    return run


def start(side: str, batch: int, ctx: int, threads: int, model: str,
          llama_server: str | None) -> tuple[subprocess.Popen, str]:
    """side: swarmtune-none, swarmtune-auto, swarmtune-N (a draft length), llama-server:TYPE, or llama-server:none
    (no speculation: what llama-server's own drafts gain, apart from how fast its plain decode is)."""
    port = free_port()
    if side.startswith("swarmtune"):
        cmd = [sys.executable, "-m", "swarmtune", "serve", "--clients", "--port", str(port), "--agents", str(batch),
               "--ctx", str(ctx), "--threads", str(threads)]
        if side != "swarmtune-none":  # swarmtune-auto, or swarmtune-N: a fixed length
            cmd += ["--draft", side.split("-", 1)[1]]
    else:
        assert llama_server is not None
        spec = side.split(":", 1)[1]
        cmd = [llama_server, "-m", model, "--port", str(port), "-np", str(batch), "-c", str(batch * ctx),
               "-t", str(threads), "-fa", "on", *engine_buffer_flags(), "--no-webui", "-b", "256", "-ub", "256"]
        if spec != "none":
            cmd += ["--spec-type", spec, "--spec-draft-n-max", "8"]
    return launch(cmd, port)


def run_side(side: str, trace_name: str, batch: int, turns: int, max_tokens: int, ctx: int, threads: int,
             model: str, llama_server: str | None) -> Run:
    proc, url = start(side, batch, ctx, threads, model, llama_server)
    try:
        return run_clients(url, trace_name, batch, turns, max_tokens)
    finally:
        stop(proc)

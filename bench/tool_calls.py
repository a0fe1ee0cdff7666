"""How often the default model's tool calls parse, without and with the grammar, and what the grammar
costs per token; against a real `swarmtune serve --clients`.

Each of --requests coding-agent prompts asks for one of three tools. "auto" lets the model write what it
likes (a call parses only if it wrote the format it was offered); "required" samples under the grammar
(engine/conversation/tool_calls.py), so a call parses unless max_tokens cuts it. The cost: one agent alone decoding
the same number of tokens with a JSON grammar and without (greedy, timed by the client from first to
last token), in ms per token.

    python bench/tool_calls.py [--requests 24] [--max-tokens 128]
"""

import argparse
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parent.parent
TOOLS = [
    {"type": "function", "function": {"name": "read_file", "description": "Read a file of the repository",
                                      "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                     "required": ["path"]}}},
    {"type": "function", "function": {"name": "run_tests", "description": "Run the tests matching a keyword",
                                      "parameters": {"type": "object", "properties": {"k": {"type": "string"}},
                                                     "required": ["k"]}}},
    {"type": "function", "function": {"name": "write_file", "description": "Write a file",
                                      "parameters": {"type": "object", "properties": {
                                          "path": {"type": "string"}, "text": {"type": "string"}},
                                          "required": ["path", "text"]}}},
]
TASKS = ["Open src/parser.py.", "Run the tests about the tokenizer.", "Create notes.md saying hello.",
         "Show me setup.cfg.", "Run the tests named test_cache.", "Read the README."]


def start() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "swarmtune", "serve", "--clients", "--port", "0", "--agents", "4"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    while True:
        line = proc.stderr.readline()
        if m := re.search(r"serving (http://\S+)", line):
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, m.group(1)
        if proc.poll() is not None:
            raise SystemExit(f"the server did not start: {line}")


def parse_rate(c: openai.OpenAI, choice: str, n: int, max_tokens: int) -> tuple[int, int]:
    ok = 0
    for i in range(n):
        r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": TASKS[i % len(TASKS)]}],
                                      tools=TOOLS, tool_choice=choice, max_tokens=max_tokens, temperature=0.7,
                                      seed=i)
        calls = r.choices[0].message.tool_calls or []
        if calls and all(isinstance(json.loads(x.function.arguments), dict) for x in calls):
            ok += 1
    return ok, n


def ms_per_token(c: openai.OpenAI, fmt: dict | None, n_tokens: int, reps: int) -> float:
    best = []
    for r in range(reps):
        kw = {"response_format": fmt} if fmt else {}
        t_first = t_last = None
        count = 0
        for ch in c.chat.completions.create(model="m", stream=True, max_tokens=n_tokens, temperature=0.8, seed=r,
                                            messages=[{"role": "user", "content": "Describe a JSON config file."}],
                                            stream_options={"include_usage": True}, **kw):
            now = time.perf_counter()
            if ch.choices and ch.choices[0].delta.content:
                t_first = t_first or now
                t_last = now
            if ch.usage:
                count = ch.usage.completion_tokens
        if t_first and t_last and count > 2:
            best.append((t_last - t_first) / (count - 1) * 1e3)
    return sorted(best)[len(best) // 2]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=24)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--reps", type=int, default=5)
    a = p.parse_args()
    proc, url = start()
    try:
        c = openai.OpenAI(base_url=url + "/v1", api_key="x", timeout=300)
        free = parse_rate(c, "auto", a.requests, a.max_tokens)
        held = parse_rate(c, "required", a.requests, a.max_tokens)
        plain = ms_per_token(c, None, 64, a.reps)
        grammar = ms_per_token(c, {"type": "json_object"}, 64, a.reps)
    finally:
        proc.terminate()
        proc.wait(30)
    print(f"default model, {a.requests} requests each, max_tokens {a.max_tokens} (measured)")
    print(f"tool calls that parse, tool_choice auto (no grammar): {free[0]}/{free[1]} ({free[0] / free[1]:.0%})")
    print(f"tool calls that parse, tool_choice required (grammar): {held[0]}/{held[1]} ({held[0] / held[1]:.0%})")
    print(f"decode, one agent: {plain:.2f} ms/token free, {grammar:.2f} ms/token under a JSON grammar "
          f"({grammar - plain:+.2f} ms, {grammar / plain:.2f}x)")
    print(f"parse rate: {held[0] / held[1]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

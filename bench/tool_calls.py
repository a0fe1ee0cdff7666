"""How the default model's tool calls come back, under tool_choice auto and required, from a real
`swarmtune serve --clients` and from llama.cpp's own `llama-server --jinja` on the same prompts; and what the
grammar costs per token.

Each of --requests coding-agent prompts asks for one of three tools, with the same seed and temperature on
both sides. Each reply is one of: a call whose arguments validate against its tool's schema; a broken call
(one that names no offered tool or does not validate, or call markup left in the content: `<tool_call>`,
`{"name"`, the tools' listing `"function": {`, the offered preamble); or an answer in text. Under "auto"
swarmtune holds a call with a lazy grammar once the model begins one (engine/conversation/formats/);
"required" holds it from the first token. The cost: one agent alone decoding the same number of tokens with a
JSON grammar and without (timed by the client from first to last token), in ms per token. llama-server is
built from the pinned sdist where missing (~11 minutes).

    python bench/tool_calls.py [--requests 24] [--max-tokens 128] [--no-llama-server]
"""

import argparse
import json
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import jsonschema
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


# a call's markup, or the offered tools' listing imitated (`{"type": "function", "function": {...`); not the
# word "function" in prose
MARKUP = ("<tool_call>", '{"name"', '"function": {', "<tools>", "# Tools")


def valid(call: Any) -> bool:
    schema = next((t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == call.function.name), None)
    try:
        args = json.loads(call.function.arguments)
        if schema is None or not isinstance(args, dict):
            return False
        jsonschema.validate(args, schema)
        return True
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False


def outcomes(c: openai.OpenAI, choice: str, n: int, max_tokens: int) -> dict[str, int]:
    """Replies with a valid call, a broken call, or text."""
    got = {"call": 0, "broken": 0, "text": 0}
    for i in range(n):
        r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": TASKS[i % len(TASKS)]}],
                                      tools=TOOLS, tool_choice=choice, max_tokens=max_tokens, temperature=0.7,
                                      seed=i)
        m = r.choices[0].message
        calls, content = m.tool_calls or [], m.content or ""
        if any(k in content for k in MARKUP) or (calls and not all(valid(x) for x in calls)):
            got["broken"] += 1
        elif calls:
            got["call"] += 1
        else:
            got["text"] += 1
    return got


def start_llama_server() -> tuple[subprocess.Popen, str]:
    sys.path.insert(0, str(ROOT / "bench"))
    from llama_tools import build_tool, engine_buffer_flags

    from swarmtune.engine.model.default_model import default_model_path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([build_tool("llama-server"), "-m", str(default_model_path()), "--jinja", "--port",
                             str(port), "-np", "4", "-c", "8192", "-t", "2", *engine_buffer_flags()],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit("llama-server did not start")


def line(side: str, choice: str, got: dict[str, int], n: int) -> str:
    return (f"{side:13} tool_choice {choice:8}: {got['call']}/{n} valid calls, {got['broken']} broken calls, "
            f"{got['text']} answers in text")


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
    p.add_argument("--no-llama-server", action="store_true", help="swarmtune's side only")
    a = p.parse_args()
    results: list[str] = []
    proc, url = start()
    try:
        c = openai.OpenAI(base_url=url + "/v1", api_key="x", timeout=300)
        auto = outcomes(c, "auto", a.requests, a.max_tokens)
        held = outcomes(c, "required", a.requests, a.max_tokens)
        plain = ms_per_token(c, None, 64, a.reps)
        grammar = ms_per_token(c, {"type": "json_object"}, 64, a.reps)
    finally:
        proc.terminate()
        proc.wait(30)
    results += [line("swarmtune", "auto", auto, a.requests), line("swarmtune", "required", held, a.requests)]
    if not a.no_llama_server:
        proc, url = start_llama_server()
        try:
            c = openai.OpenAI(base_url=url + "/v1", api_key="x", timeout=300)
            theirs = outcomes(c, "auto", a.requests, a.max_tokens)
            theirs_held = outcomes(c, "required", a.requests, a.max_tokens)
        finally:
            proc.terminate()
            proc.wait(30)
        results += [line("llama-server", "auto", theirs, a.requests),
                    line("llama-server", "required", theirs_held, a.requests)]
    print(f"default model, {a.requests} requests a side and choice, max_tokens {a.max_tokens}, temperature 0.7, "
          "seeds 0.. (measured)")
    print("\n".join(results))
    print(f"decode, one agent: {plain:.2f} ms/token free, {grammar:.2f} ms/token under a JSON grammar "
          f"({grammar - plain:+.2f} ms, {grammar / plain:.2f}x)")
    begun = auto["call"] + auto["broken"]
    print(f"auto: of {begun} replies that began a call, {auto['call']} returned a valid call")
    return 0


if __name__ == "__main__":
    sys.exit(main())

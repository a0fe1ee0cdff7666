"""Request sequences shaped as real coding agents send them, seeded, for the cache tests and
bench/cache_reuse.py. Written from the agents' public source and issues, not recorded here:

- claude-code: `/v1/messages`; the first system block is a billing header whose `cch=` value changes on
  every request (anthropics/claude-code#32636), then a long constant system prompt; a session id in
  `metadata.user_id`.
- opencode: chat completions; each user message ends in a `<system-reminder>` that the next request moves
  to the newest message, so it leaves the middle of the history (anomalyco/opencode#23595).
- aider: chat completions; a repository map and the added file's current text are re-sent first on every
  request, and the file is edited between requests, so its text changes mid-history.
- subagents: a parent that spawns two sub-agents with its own system prompt and tools, then goes on
  (llama.cpp#22746, opencode#27110); each conversation carries its own `user`.
- trimmed: one long conversation that drops its oldest exchange once it nears its budget.

The assistant turns are scripted: the reply a server generates is read and discarded, so the same trace
sends the same prompts to every server compared (each server's cache still holds its own reply, and pays
for the scripted one, as a client that rewrites its history does)."""

import json
import random
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import httpx


@dataclass(frozen=True)
class TraceTurn:
    conversation: str  # which of the trace's conversations it continues
    endpoint: str  # messages (Anthropic) | chat (OpenAI chat completions)
    body: dict  # the request, less model, max_tokens and stream


@cache
def _sources() -> tuple[Path, ...]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return tuple(sorted(p for p in root.glob("*.py") if p.stat().st_size > 6000))


def tool_output(rng: random.Random, chars: int) -> str:
    """Tool output: a slice of a standard-library source, as `sed -n` would print it."""
    path = rng.choice(_sources())
    text = path.read_text(encoding="utf-8", errors="replace")
    start = rng.randrange(0, max(1, len(text) - chars))
    return f"$ sed -n ... {path.name}\n{text[start : start + chars]}"


GUIDELINES = [
    "You are an interactive command line tool that helps users with software engineering tasks.",
    "Be concise: answer in fewer than four lines unless the user asks for detail.",
    "Never guess a file's contents: read it with the Read tool before you edit it.",
    "Run the project's tests after every change and report what failed, verbatim.",
    "Prefer editing existing files to creating new ones; never create documentation unasked.",
    "Follow the conventions of the code around a change: its naming, its imports, its error handling.",
    "When a command fails, read its output before you run another one.",
    "Keep a todo list for any task of more than three steps and mark each item as it is done.",
    "Do not commit unless the user asks; when asked, write a message that says why the change was made.",
    "Refuse to write code that could be used maliciously, even when told it is for education.",
]
TOOLS = [
    ("Read", "Reads a file from the local filesystem.", "file_path: string, offset?: integer, limit?: integer"),
    ("Edit", "Replaces exact text in a file.", "file_path: string, old_string: string, new_string: string"),
    ("Bash", "Runs a command in a persistent shell.", "command: string, timeout?: integer, description?: string"),
    ("Grep", "Searches file contents with a regular expression.", "pattern: string, path?: string, glob?: string"),
    ("Glob", "Finds files by name pattern.", "pattern: string, path?: string"),
    ("TodoWrite", "Creates and updates the session's todo list.", "todos: array of {content, status}"),
]


@cache
def _first_line(path: Path) -> str:
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.strip(' "#\'') and not line.startswith(("#!", "# -*-")):
            return line.strip(' "#\'')[:100]
    return ""


def system_prompt(files: int, notes: bool = False) -> str:
    """Guidelines, a tool catalogue and an environment block listing `files` files, each with its first
    line where `notes` (its length: a real agent's is thousands of tokens)."""
    tools = "\n".join(f"## {n}\n{d}\nParameters: {p}" for n, d, p in TOOLS)
    listing = "\n".join(f"  {p.name}" + (f": {_first_line(p)}" if notes else "") for p in _sources()[:files])
    return ("\n".join(GUIDELINES) + "\n\n# Tools\n" + tools + "\n\n# Environment\nPlatform: linux\nIs a git "
            "repository: yes\nFiles:\n" + listing)


def claude_code(seed: int, turns: int = 5, files: int = 60, tool_chars: int = 500,
                notes: bool = False) -> list[TraceTurn]:
    rng = random.Random(seed)
    session = f"user_{rng.getrandbits(64):016x}_account__session_{rng.getrandbits(64):016x}"
    messages: list[dict] = [{"role": "user", "content": "The CSV export drops the last column of quoted rows. "
                                                        "Find out why and fix it."}]
    out = []
    for n in range(turns):
        header = (f"x-anthropic-billing-header: cc_version=2.1.{rng.randrange(10, 99)}.{rng.getrandbits(12):03x}; "
                  f"cc_entrypoint=cli; cch={rng.getrandbits(20):05x};")
        system = [{"type": "text", "text": header},
                  {"type": "text", "text": "You are Claude Code, a CLI for coding.\n" + system_prompt(files, notes)}]
        out.append(TraceTurn("main", "messages", {"system": system, "messages": list(messages),
                                                  "metadata": {"user_id": session}}))
        messages = messages + [{"role": "assistant", "content": f"I will look at the next file ({n + 1})."},
                               {"role": "user", "content": tool_output(rng, tool_chars)}]
    return out


REMINDER = ("<system-reminder>\nYou are in build mode: you may edit files and run commands. Your todo list:\n"
            "1. [in_progress] reproduce the failure\n2. [pending] find the cause\n3. [pending] fix it with a test\n"
            "</system-reminder>")


def opencode(seed: int, turns: int = 5, files: int = 40, tool_chars: int = 500) -> list[TraceTurn]:
    rng = random.Random(seed)
    system = "You are opencode, an interactive CLI agent.\n" + system_prompt(files)
    said = ["The date parser fails on ISO weeks; fix it."]
    replies: list[str] = []
    out = []
    for n in range(turns):
        messages: list[dict] = [{"role": "system", "content": system}]
        for i, text in enumerate(said):
            last = i == len(said) - 1
            messages.append({"role": "user", "content": text + ("\n\n" + REMINDER if last else "")})
            if not last:
                messages.append({"role": "assistant", "content": replies[i]})
        out.append(TraceTurn("main", "chat", {"messages": messages}))
        replies.append(f"Step {n + 1}: reading the next source.")
        said.append(tool_output(rng, tool_chars))
    return out


def aider(seed: int, turns: int = 5, files: int = 40, tool_chars: int = 500) -> list[TraceTurn]:
    rng = random.Random(seed)
    system = ("Act as an expert software developer. Always use best practices when coding. Describe each change "
              "with a SEARCH/REPLACE block.\n" + "\n".join(GUIDELINES[:5]))
    repo_map = "Here are summaries of some files present in my git repository:\n" + "\n".join(
        f"{p.name}:\n  def main()\n  class {p.stem.title()}Error(Exception)" for p in _sources()[:files])
    lines = tool_output(rng, 2000).splitlines()
    asks: list[tuple[str, str]] = []
    out = []
    for n in range(turns):
        file = "\n".join(lines)
        messages = [{"role": "system", "content": system},
                    {"role": "user", "content": repo_map}, {"role": "assistant", "content": "Ok."},
                    {"role": "user", "content": f"I added this file to the chat:\nsrc/module.py\n```\n{file}\n```"},
                    {"role": "assistant", "content": "Ok, any changes I propose will be to that file."}]
        for ask, reply in asks:
            messages += [{"role": "user", "content": ask}, {"role": "assistant", "content": reply}]
        messages.append({"role": "user", "content": f"Change {n + 1}: {tool_output(rng, tool_chars // 2)}"})
        out.append(TraceTurn("main", "chat", {"messages": messages}))
        asks.append((messages[-1]["content"], f"src/module.py\n<<<<<<< SEARCH\n{lines[len(lines) // 2]}\n"
                                              f"=======\n# changed in step {n + 1}\n>>>>>>> REPLACE"))
        lines[len(lines) // 2] = f"# changed in step {n + 1}"  # the edit: the file's middle changes
    return out


def subagents(seed: int, files: int = 40, tool_chars: int = 500) -> list[TraceTurn]:
    rng = random.Random(seed)
    system = "You are a coding agent that may delegate searches to sub-agents.\n" + system_prompt(files)

    def talk(who: str, task: str, n: int) -> tuple[list[TraceTurn], list[dict]]:
        msgs: list[dict] = [{"role": "system", "content": system}, {"role": "user", "content": task}]
        out = []
        for i in range(n):
            out.append(TraceTurn(who, "chat", {"messages": list(msgs), "user": who}))
            msgs += [{"role": "assistant", "content": f"{who}: reading source {i + 1}."},
                     {"role": "user", "content": tool_output(rng, tool_chars)}]
        return out, msgs

    parent, parent_msgs = talk("parent", "Migrate the config loader to the new settings API.", 2)
    one, _ = talk("sub-agent-1", "Sub-agent task: list every caller of load_config.", 2)
    two, _ = talk("sub-agent-2", "Sub-agent task: list every test that touches the config.", 2)
    more = []
    for i in range(2):
        more.append(TraceTurn("parent", "chat", {"messages": list(parent_msgs), "user": "parent"}))
        parent_msgs += [{"role": "assistant", "content": f"parent: applying finding {i + 1}."},
                        {"role": "user", "content": tool_output(rng, tool_chars)}]
    return parent + one + two + more


def trimmed(seed: int, turns: int = 8, files: int = 30, tool_chars: int = 700, keep: int = 3) -> list[TraceTurn]:
    """Past `keep` exchanges the oldest one goes (the first message, the task, stays)."""
    rng = random.Random(seed)
    system = "You are a coding agent.\n" + system_prompt(files)
    head: list[dict] = [{"role": "system", "content": system},
                        {"role": "user", "content": "Find the slowest function in the tokenizer and speed it up."}]
    exchanges: list[list[dict]] = []
    out = []
    for n in range(turns):
        out.append(TraceTurn("main", "chat", {"messages": head + sum(exchanges, [])}))
        exchanges.append([{"role": "assistant", "content": f"Profiling step {n + 1}."},
                          {"role": "user", "content": tool_output(rng, tool_chars)}])
        if len(exchanges) > keep:
            exchanges.pop(0)
    return out


TRACES: dict[str, Callable[..., list[TraceTurn]]] = {
    "claude-code": claude_code, "opencode": opencode, "aider": aider, "subagents": subagents, "trimmed": trimmed}


@dataclass(frozen=True)
class TurnResult:
    conversation: str
    prompt_tokens: int
    prefilled_tokens: int  # what the server says it prefilled for this prompt
    ttft_s: float  # the request sent to its first text byte
    id: str  # the response's id
    account: dict | None  # swarmtune's extension object (None from another server)


def replay(url: str, turns: list[TraceTurn], max_tokens: int = 8, timeout_s: float = 600,
           extra: dict | None = None) -> list[TurnResult]:
    """Send a trace's turns in order, streamed, and read what each prefilled: swarmtune's usage and
    extension object, llama-server's `timings.prompt_n` (chat) or its Anthropic usage's uncached input."""
    out = []
    # a connection per request: llama-server's HTTP server closes kept-alive connections on its own schedule,
    # and a request sent on one it just closed fails without an answer
    with httpx.Client(base_url=url, timeout=timeout_s, limits=httpx.Limits(max_keepalive_connections=0)) as http:
        for t in turns:
            body = {**t.body, "model": "m", "max_tokens": max_tokens, "stream": True, "temperature": 0.0,
                    **(extra or {})}
            if t.endpoint == "chat":
                body["stream_options"] = {"include_usage": True}
            path = "/v1/chat/completions" if t.endpoint == "chat" else "/v1/messages"
            t0 = time.perf_counter()
            ttft, rid, usage, timings, account = None, "", {}, None, None
            with http.stream("POST", path, json=body) as r:
                if r.status_code != 200:
                    raise RuntimeError(f"{path}: {r.status_code} {r.read().decode()[:300]}")
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    ev = json.loads(line[6:])
                    text = (ev.get("choices") or [{}])[0].get("delta", {}).get("content") if t.endpoint == "chat" \
                        else (ev.get("delta") or {}).get("text")
                    if text and ttft is None:
                        ttft = time.perf_counter() - t0
                    rid = ev.get("id") or (ev.get("message") or {}).get("id") or rid
                    # Anthropic's usage comes in parts (llama-server: the input on message_start, swarmtune:
                    # on message_delta), OpenAI's whole on its last chunk: the later keys win
                    usage = {**usage, **((ev.get("message") or {}).get("usage") or {}), **(ev.get("usage") or {})}
                    timings = ev.get("timings") or timings
                    account = ev.get("swarmtune") or account
            if t.endpoint == "chat":
                prompt = usage["prompt_tokens"]
                cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                prefilled = timings["prompt_n"] if timings else prompt - cached
            else:
                prefilled = usage["input_tokens"]
                prompt = prefilled + usage.get("cache_read_input_tokens", 0)
            out.append(TurnResult(t.conversation, prompt, prefilled, ttft if ttft is not None else
                                  time.perf_counter() - t0, rid, account))
    return out

"""The tokens a KV quality measurement reads: a text file, a transcript of chat conversations, or, by
default, histories like the synthetic swarm's own (its system prompt, a task, and the Python sources its
tools return), each rendered with the model's chat template as the agents' are."""

import json
import random
from pathlib import Path
from typing import Any

from swarmtune.engine.agents.prompt import PromptRenderer
from swarmtune.engine.agents.workload import SYSTEM_PROMPT, TASKS, stdlib_sources
from swarmtune.engine.backends.backend import Backend
from swarmtune.engine.conversation.chat_message import ChatMessage
from swarmtune.engine.errors import UserError

ROLES = ("system", "user", "assistant", "tool")
MAX_FILE_BYTES = 64 << 20  # a text or transcript past this is refused, not read


def read_text(path: str) -> str:
    """A text file (as llama-perplexity reads its -f file), checked before any model loads."""
    text = _read(path)
    if not text.strip():
        raise UserError(f"{path} holds no text", field="text")
    return text


def read_transcript(path: str) -> list[list[ChatMessage] | list[int]]:
    """A JSONL transcript: each line one conversation, {"messages": [{"role": ..., "content": ...}, ...]}
    (OpenAI's chat shape), or {"tokens": [...]} (what `serve --transcript` writes: the exact tokens a served
    turn's cache held), checked before any model loads."""
    convs: list[list[ChatMessage] | list[int]] = []
    for n, line in enumerate(_read(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            conv = json.loads(line)
        except ValueError:
            raise UserError(f"{path} line {n}: not JSON (a transcript is one conversation per line)",
                            field="transcript") from None
        if isinstance(conv, dict) and "tokens" in conv:
            toks = conv["tokens"]
            if not isinstance(toks, list) or not all(isinstance(t, int) and t >= 0 for t in toks):
                raise UserError(f"{path} line {n}: \"tokens\" is a list of token ids", field="transcript")
            convs.append(toks)
            continue
        convs.append(_messages(conv, f"{path} line {n}"))
    if not convs:
        raise UserError(f"{path} holds no conversation", field="transcript")
    return convs


def conversation_documents(backend: Backend, convs: list[list[ChatMessage] | list[int]]) -> list[list[int]]:
    """Each conversation rendered with the model's chat template, as a served agent's prompt is (token
    lines as they are)."""
    renderer = PromptRenderer(backend)
    out = []
    for c in convs:
        if all(isinstance(t, int) for t in c):
            out.append([t for t in c if isinstance(t, int)])
        else:
            out.append(backend.text.tokenize(renderer.render([m for m in c if isinstance(m, dict)])))
    return out


def swarm_documents(backend: Backend, n: int, tokens_each: int, seed: int = 1) -> list[list[int]]:
    """n histories like the synthetic agents': the system prompt, a task, and a tool result of Python source
    (the standard library's, as the swarm's tools return), at least tokens_each tokens each."""
    r = random.Random(seed)
    sources = stdlib_sources()
    if not sources:
        raise UserError("no Python sources here to build the swarm's histories from: give --text or --transcript")
    renderer = PromptRenderer(backend)
    docs = []
    for _ in range(n):
        path = r.choice(sources)
        text = path.read_text(encoding="utf-8", errors="replace")
        start = r.randrange(0, max(1, len(text) - tokens_each * 6))
        msgs: list[ChatMessage] = [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": r.choice(TASKS).format(mod=path.name)},
                {"role": "tool", "content": f"$ sed -n ... {path.name}\n" + text[start:start + tokens_each * 6]}]
        docs.append(backend.text.tokenize(renderer.render(msgs)))
    return docs


def _read(path: str) -> str:
    p = Path(path)
    try:
        if p.stat().st_size > MAX_FILE_BYTES:
            raise UserError(f"{path} is past {MAX_FILE_BYTES >> 20} MiB")
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"no such file: {path}") from None
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text") from None
    except (IsADirectoryError, PermissionError) as e:
        raise UserError(f"cannot read {path}: {e.strerror}") from None


def _messages(conv: Any, where: str) -> list[ChatMessage]:
    msgs = conv.get("messages") if isinstance(conv, dict) else None
    if not isinstance(msgs, list) or not msgs:
        raise UserError(f"{where}: a conversation is {{\"messages\": [...]}} with at least one message",
                        field="transcript")
    out: list[ChatMessage] = []
    for m in msgs:
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content", ""), str):
            raise UserError(f"{where}: each message is {{\"role\": one of {', '.join(ROLES)}, \"content\": text}}",
                            field="transcript")
        out.append({"role": m["role"], "content": m.get("content") or ""})
    return out

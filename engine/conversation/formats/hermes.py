"""Hermes and Qwen (2.5, 3): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block a call,
after an optional `<think>…</think>`. The body is read as JSON, so a `</tool_call>` inside one of its strings
does not end the block. Also what swarmtune offers a template that has no tools of its own
(engine/conversation/chat_template.py), and the format a family swarmtune does not know is read in."""

import json
from typing import Any

from swarmtune.engine.conversation.formats.base import Format, json_call
from swarmtune.engine.conversation.formats.grammar import json_call_object, literal, repeated
from swarmtune.engine.conversation.formats.reply import Reply, ReplyContext, ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_DECODER = json.JSONDecoder()


class Hermes(Format):
    name = "qwen3-hermes"
    markers = (OPEN, CLOSE, "<think>", "</think>")
    call_start = OPEN

    @classmethod
    def for_template(cls, source: str) -> "Hermes | None":
        return cls() if OPEN in source else None

    def call_grammar(self, tools: list[dict[str, Any]], parallel: bool) -> str:
        rules, call = json_call_object(tools, "arguments")
        one = f'{literal(OPEN + chr(10))} {call} {literal(chr(10) + CLOSE)}'
        return rules + "\n" + repeated(one, parallel) + "\n"

    def parse(self, text: str, ctx: ReplyContext, final: bool = True) -> Reply:
        reasoning, rest = self.split_reasoning(text, ctx)
        calls: list[ToolCall] = []
        content, pos, scan, broken = [], 0, 0, ""
        while (start := rest.find(OPEN, scan)) >= 0:
            kind, call, end = _block(rest, start + len(OPEN), final)
            if kind == _OPEN_BLOCK:  # a call still open: not content yet, nor a call
                if final:
                    broken = broken or "the reply ended inside a call (max_tokens?)"
                break
            if call is None:  # stays content, as the model wrote it
                broken = broken or f"a {OPEN} block that is not a JSON call: {rest[start:end][:80]!r}"
                scan = start + len(OPEN)
                continue
            content.append(rest[pos:start])
            calls.append(call)
            pos = scan = end
        else:
            start = len(rest)
        content.append(rest[pos:start])
        text_out = "".join(content)
        return Reply(text_out if text_out.strip() else "", reasoning, tuple(calls), broken)


_OPEN_BLOCK, _CLOSED = "open", "closed"


def _block(text: str, at: int, final: bool) -> tuple[str, ToolCall | None, int]:
    """The block whose body starts at `at`: (_CLOSED, its call or None where it is no call, where it ends), or
    (_OPEN_BLOCK, None, -1) where the text ends before it could close. The body is read as JSON, from its
    first brace to that value's end, so a closer inside one of its strings does not end the block."""
    body = _skip_space(text, at)
    if body == len(text):
        return _OPEN_BLOCK, None, -1
    if text[body] != "{":
        return _CLOSED, None, body
    try:
        obj, end = _DECODER.raw_decode(text, body)
    except (ValueError, RecursionError):  # JSONDecodeError, or an integer past the digit limit
        # JSON cut short may yet be completed; at the end, a closer after it says it was never JSON
        close = text.find(CLOSE, body) if final else -1
        return (_CLOSED, None, close + len(CLOSE)) if close >= 0 else (_OPEN_BLOCK, None, -1)
    after = _skip_space(text, end)
    if len(text) - after < len(CLOSE) and CLOSE.startswith(text[after:]):  # its closer not (all) written yet
        return _OPEN_BLOCK, None, -1
    if not text.startswith(CLOSE, after):
        return _CLOSED, None, after
    return _CLOSED, json_call(obj), after + len(CLOSE)


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at

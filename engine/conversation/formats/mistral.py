"""Mistral, Devstral, Ministral, Magistral: `[TOOL_CALLS]`, then a call. Tokenizers v11 and later (Mistral
Small 3.2, Devstral, Ministral 3, Magistral) write one call a marker, `[TOOL_CALLS]get_weather[ARGS]{"city":
"Paris"}`, the name sometimes followed by `[CALL_ID]<9 characters>`; v3 (Mistral 7B v0.3, Nemo) writes one
JSON array of them, `[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]`. The reasoning
models think first in `[THINK]…[/THINK]` (v13, control tokens), or in plain `<think>…</think>` (Magistral
Small 2506).

From mistral-common's tokenizers (the control tokens and the order they come in) and the chat templates
llama.cpp vendors (Mistral Small 3.2, Devstral, Ministral 3 Reasoning, Mistral Nemo), read as llama.cpp's
Ministral 3 parser and vLLM's mistral tool and reasoning parsers read them. Those templates refuse a call id
that is not 9 letters or digits, so a call without one gets one of that shape."""

import re
import uuid
from typing import Any

from swarmtune.engine.conversation.formats.base import Format, dumps
from swarmtune.engine.conversation.formats.grammar import json_call_object, literal, schema_rules, tool_parts
from swarmtune.engine.conversation.formats.llama3 import BAD, CUT, load_json, scan_json, skip_ws
from swarmtune.engine.conversation.formats.reply import Reply, ReplyContext, ToolCall

TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
THINK, THINK_END = "[THINK]", "[/THINK]"
TEXT_THINK, TEXT_THINK_END = "<think>", "</think>"

_NAME = re.compile(r"[\w.\-]+")
_ID = re.compile(r"[\w\-]*")

# what _call found: a call (or the v3 array's calls) closed; the reply ended inside one; no call at all
_CLOSED, _OPEN, _BAD = "closed", "open", "bad"


def mistral_call_id() -> str:
    """An id Mistral's templates take back: 9 letters or digits."""
    return uuid.uuid4().hex[:9]


class Mistral(Format):
    name = "mistral"
    markers = (TOOL_CALLS, ARGS, CALL_ID, THINK, THINK_END, TEXT_THINK, TEXT_THINK_END)
    call_start = TOOL_CALLS
    think_open = THINK
    think_close = THINK_END

    def __init__(self, text_think: bool = False, args_form: bool = True) -> None:
        # a reasoning model's template: its reasoning may be written in plain <think> tags too (Magistral 2506)
        self.text_think = text_think
        self.args_form = args_form  # v11+: NAME[ARGS]{...} a call; v3: one JSON array of calls

    @classmethod
    def for_template(cls, source: str) -> "Mistral | None":
        if TOOL_CALLS not in source:
            return None
        return cls(text_think=THINK in source or TEXT_THINK in source, args_form=ARGS in source)

    def call_grammar(self, tools: list[dict[str, Any]], parallel: bool) -> str:
        """v11+: `[TOOL_CALLS]NAME[ARGS]{...}`, the marker again before each further call; v3: one
        `[TOOL_CALLS][{"name", "arguments"}, ...]` array."""
        if not self.args_form:
            rules, call = json_call_object(tools, "arguments")
            root = f"root ::= {literal(TOOL_CALLS + '[')} {call} " + (f'("," " "? {call})* ' if parallel else "")
            return f'{rules}\n{root}"]"\n'
        parts, alternatives = [], []
        for i, (name, params) in enumerate(tool_parts(tools)):
            body, root = schema_rules(params, f"args{i}")
            parts.append(body)
            alternatives.append(f"{literal(TOOL_CALLS + name + ARGS)} {root}")
        root = "root ::= call" + (" call*" if parallel else "")
        return "\n".join(parts) + "\ncall ::= " + " | ".join(alternatives) + f"\n{root}\n"

    def split_reasoning(self, text: str, ctx: ReplyContext) -> tuple[str, str]:
        if not ctx.reasoning:
            return "", text
        body, close = text, THINK_END
        if not self.starts_in_reasoning(ctx):
            stripped = text.lstrip()
            pairs = [(THINK, THINK_END)] + ([(TEXT_THINK, TEXT_THINK_END)] if self.text_think else [])
            opened = next(((o, c) for o, c in pairs if stripped.startswith(o)), None)
            if opened is None:
                if stripped and any(o.startswith(stripped) for o, _ in pairs):
                    return "", ""  # maybe the opener, half-written
                return "", text
            body, close = stripped[len(opened[0]):], opened[1]
        end = body.find(close)
        if end < 0:
            return body.lstrip(), ""
        return body[:end].strip(), body[end + len(close):].lstrip()

    def parse(self, text: str, ctx: ReplyContext, final: bool = True) -> Reply:
        reasoning, rest = self.split_reasoning(text, ctx)
        calls: list[ToolCall] = []
        content: list[str] = []
        pos = scan = 0
        broken = ""
        while (start := rest.find(TOOL_CALLS, scan)) >= 0:
            kind, found, end = _call(rest, start + len(TOOL_CALLS))
            if kind == _OPEN:  # a call still being written: not content yet, nor a call
                if final:
                    broken = broken or "the reply ended inside a call (max_tokens?)"
                break
            if kind == _BAD:  # stays content, as the model wrote it
                broken = broken or f"{TOOL_CALLS} not followed by a call: {rest[start:start + 80]!r}"
                scan = start + len(TOOL_CALLS)
                continue
            content.append(rest[pos:start])
            calls.extend(found)
            pos = scan = end
        else:
            start = len(rest)
        content.append(rest[pos:start])
        out = "".join(content)
        return Reply(out if out.strip() else "", reasoning, tuple(calls), broken)


def _call(text: str, at: int) -> tuple[str, list[ToolCall], int]:
    """What follows a [TOOL_CALLS] at `at`: (_CLOSED, its calls, where they end), (_OPEN, [], -1) where the text
    ends before they could, or (_BAD, [], -1) where no call can follow."""
    i = skip_ws(text, at)
    if i == len(text):
        return _OPEN, [], -1
    if text[i] in "[{":  # v3: a JSON array of calls (or, leniently, one call object)
        end = scan_json(text, i)
        if end == CUT:
            return _OPEN, [], -1
        calls = _json_calls(load_json(text[i:end])) if end != BAD else None
        return (_CLOSED, calls, end) if calls else (_BAD, [], -1)
    m = _NAME.match(text, i)
    if m is None:
        return _BAD, [], -1
    name, i = m.group(), m.end()
    call_id = ""
    if text.startswith(CALL_ID, i):
        m = _ID.match(text, i + len(CALL_ID))
        assert m is not None  # _ID matches the empty string at worst
        call_id, i = m.group(), m.end()
    if not text.startswith(ARGS, i):
        tail = text[i:] if len(text) - i < len(CALL_ID) else None  # the text ends in a marker, half-written
        maybe = tail is not None and (ARGS.startswith(tail) or (not call_id and CALL_ID.startswith(tail)))
        return (_OPEN, [], -1) if maybe else (_BAD, [], -1)
    i = skip_ws(text, i + len(ARGS))
    if i == len(text):
        return _OPEN, [], -1
    if text[i] != "{":
        return _BAD, [], -1
    end = scan_json(text, i)
    if end == CUT:
        return _OPEN, [], -1
    args = load_json(text[i:end]) if end != BAD else None
    if not isinstance(args, dict):
        return _BAD, [], -1
    return _CLOSED, [ToolCall(name, dumps(args), call_id or mistral_call_id())], end


def _json_calls(value: Any) -> list[ToolCall] | None:
    """v3's calls: `[{"name": ..., "arguments": {...}, "id"?: ...}, ...]`; None where any is no call."""
    items = value if isinstance(value, list) else [value]
    calls: list[ToolCall] = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            return None
        args = item.get("arguments", item.get("parameters", {}))
        if isinstance(args, str):
            args = load_json(args) if args.strip() else {}
        if not isinstance(args, dict):
            return None
        call_id = item.get("id")
        calls.append(ToolCall(item["name"], dumps(args), call_id if isinstance(call_id, str) and call_id
                              else mistral_call_id()))
    return calls or None

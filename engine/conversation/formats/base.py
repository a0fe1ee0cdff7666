"""The contract every family's format keeps, and the pieces most of them share: a thinking block, a partial
marker at a stream's tail, a JSON call, a text value cast to its parameter's schema.

A format's `parse(text, ctx, final)` reads a reply as if it ended at `text`. With final False the reply may
go on: a call that is still open is neither a call nor content yet. The stream (formats/stream.py) relies on
one property: the parse of a prefix is a prefix of the parse of the whole (content, reasoning and calls
alike), trailing whitespace aside. Every format here is written to keep it."""

import json
import re
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from swarmtune.engine.conversation.formats.reply import Reply, ReplyContext, ToolCall, new_call_id


class Format(ABC):
    name: ClassVar[str]  # the family, as canitoolcall and the records name it
    markers: ClassVar[tuple[str, ...]]  # what a stream must not let out half-written
    call_start: ClassVar[str] = ""  # the text a call (or a block of calls) begins with: the lazy grammar's trigger
    think_open: ClassVar[str] = "<think>"
    think_close: ClassVar[str] = "</think>"

    @classmethod
    @abstractmethod
    def for_template(cls, source: str) -> "Format | None":
        """This family's format, set up for the template (a family's variants differ), where the template
        writes it; None where it does not."""

    @abstractmethod
    def parse(self, text: str, ctx: ReplyContext, final: bool = True) -> Reply: ...

    def parse_without_calls(self, text: str, ctx: ReplyContext, final: bool = True) -> Reply:
        """A reply to a request that offered no tools: its reasoning split off, the rest content as written
        (nothing held back as a call). A format whose reasoning is not a block at the start overrides it."""
        reasoning, rest = self.split_reasoning(text, ctx)
        return Reply(rest, reasoning)

    def call_grammar(self, tools: list[dict[str, Any]], parallel: bool) -> str | None:
        """GBNF whose root is a call of one of these tools (one or more, where parallel) in this family's own
        format, from call_start on, its arguments validating against the tool's schema; None where swarmtune
        writes no grammar for the family (formats/grammar.py has the pieces)."""
        return None

    def triggers(self) -> tuple[str, ...]:
        """Regexes searched in the reply so far: a lazy grammar holds from the first match (its first group's
        start, or the match's), as llama-server holds a call under tool_choice auto."""
        return (re.escape(self.call_start),) if self.call_start else ()

    def starts_in_reasoning(self, ctx: ReplyContext) -> bool:
        """The template opened the thinking block in the prompt (`<think>\\n` at its end)."""
        return bool(self.think_open) and ctx.prompt_tail.rstrip().endswith(self.think_open)

    def split_reasoning(self, text: str, ctx: ReplyContext) -> tuple[str, str]:
        """(reasoning, the rest) of a reply whose thinking block comes first, if it has one."""
        if not ctx.reasoning or not self.think_open:
            return "", text
        body = text
        if not self.starts_in_reasoning(ctx):
            stripped = text.lstrip()
            if not stripped.startswith(self.think_open):
                if self.think_open.startswith(stripped) and stripped:
                    return "", ""  # maybe the block's opener, half-written
                return "", text
            body = stripped[len(self.think_open):]
        end = body.find(self.think_close)
        if end < 0:
            return body.strip(), ""
        return body[:end].strip(), body[end + len(self.think_close):].lstrip()


def held_tail(text: str, markers: tuple[str, ...]) -> int:
    """How many characters at the end of `text` may be the start of a marker (held back from a stream)."""
    best = 0
    for m in markers:
        for n in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:n]):
                best = n
                break
    return best


def json_call(obj: Any, arg_keys: tuple[str, ...] = ("arguments", "parameters")) -> ToolCall | None:
    """A call from a decoded `{"name": ..., "arguments": {...}}` (or "parameters"); None where it is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args: Any = {}
    for key in arg_keys:
        if key in obj:
            args = obj[key]
            break
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:  # JSONDecodeError, or an integer past Python's digit limit
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], dumps(args), new_call_id())


def dumps(args: Any) -> str:
    return json.dumps(args, ensure_ascii=False)


def loads_object(text: str) -> dict[str, Any] | None:
    """A JSON object, or None where the text is not exactly one."""
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):  # JSONDecodeError, or an integer past the digit limit
        return None
    return obj if isinstance(obj, dict) else None


MAX_NUMBER_CHARS = 4000  # past Python's 4,300-digit limit int() raises; such a "number" stays text
_NUMBER = re.compile(r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?")


def cast_value(text: str, schema: dict[str, Any] | None) -> Any:
    """A parameter written as text (Qwen's XML, GLM's arg_value, DeepSeek's DSML) as the tool's schema types
    it, as vLLM's and llama.cpp's parsers cast it: a string stays the text; a number, a boolean, null, an
    object or an array is read as JSON. Without a schema, JSON where the text is JSON, else the text."""
    types = _types(schema)
    if types == {"string"}:
        return text
    stripped = text.strip()
    if types & {"integer", "number"} and _NUMBER.fullmatch(stripped) and len(stripped) <= MAX_NUMBER_CHARS:
        value = json.loads(stripped)
        if "integer" in types and "number" not in types and isinstance(value, float) and value.is_integer():
            return int(value)
        return value
    if "boolean" in types and stripped.lower() in ("true", "false"):
        return stripped.lower() == "true"
    if "null" in types and stripped.lower() in ("null", "none"):
        return None
    try:
        value = json.loads(stripped)
    except (ValueError, RecursionError):  # JSONDecodeError, or an integer past the digit limit
        return text
    if types and "string" in types and not isinstance(value, (dict, list)):
        return text
    return value


def _types(schema: dict[str, Any] | None) -> set[str]:
    if not schema:
        return set()
    t = schema.get("type")
    if isinstance(t, str):
        return {t}
    if isinstance(t, list):
        return {x for x in t if isinstance(x, str)}
    out: set[str] = set()
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or []:
            if isinstance(sub, dict):
                out |= _types(sub)
    if "enum" in schema and not out:
        out |= {"string"} if all(isinstance(v, str) for v in schema["enum"]) else set()
    return out

"""DeepSeek's DSML (V3.2, V4, V4.1): a block of invokes, each parameter typed by its `string` attribute:

    <｜DSML｜tool_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜tool_calls>

V3.2 names the block `function_calls`, V4 `tool_calls`, and V4.1's encoder writes a space after the DSML
token in every tag (`<｜DSML｜ calls>`, `<｜DSML｜ invoke name=…>`, `</｜DSML｜ parameter>`). The tags are
read in any of these spellings: the markup is one, and the only template of V4.1's time that llama.cpp
vendors (deepseek-ai-DeepSeek-V4-Flash-0731.jinja) still writes V4's. A `string="true"` value is the raw
text between the tags, whitespace and all (no escaping); a `string="false"` one is JSON (DeepSeek's
encoding_dsv32.py/encoding_dsv4.py render them so, and llama.cpp's common/parsers/deepseek.cpp reads them
so). An invoke with no parameters may close itself (`<｜DSML｜invoke name="submit"/>`, as SGLang reports V4
writing it)."""

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from swarmtune.engine.conversation.formats.base import cast_value, dumps
from swarmtune.engine.conversation.formats.reply import ReplyContext, ToolCall, new_call_id

TOKEN = "｜DSML｜"
DSML_OPENERS = (f"<{TOKEN}function_calls>", f"<{TOKEN}tool_calls>", f"<{TOKEN} calls>")
_BLOCK = r"(?:function_calls|tool_calls|calls)"
DSML_OPEN = re.compile(rf"<{TOKEN} ?{_BLOCK}>")
_CLOSE = re.compile(rf"</{TOKEN} ?{_BLOCK}>")
_INVOKE = re.compile(rf"<{TOKEN} ?invoke(?=[\s/>])")
_INVOKE_END = re.compile(rf"</{TOKEN} ?invoke>")
_PARAM = re.compile(rf"<{TOKEN} ?parameter(?=[\s>])")
_PARAM_END = re.compile(rf"</{TOKEN} ?parameter>")
_INVOKE_ATTRS = re.compile(r'\s+name="(?P<name>[^"]+)"\s*(?P<closed>/)?>')
_PARAM_ATTRS = re.compile(r'\s+name="(?P<name>[^"]+)"(?:\s+string="(?P<string>[^"]*)")?\s*>')
# every tag a block's piece may begin with, in both spellings: a tail that begins one is not yet text
_STARTS = tuple(f"{lt}{TOKEN}{sp}{tag}" for lt, tag in (("<", "invoke "), ("</", "function_calls>"),
                                                        ("</", "tool_calls>"), ("</", "calls>"))
                for sp in ("", " "))
_IN_INVOKE = tuple(f"{lt}{TOKEN}{sp}{tag}" for lt, tag in (("<", "parameter "), ("</", "invoke>"))
                   for sp in ("", " "))


@dataclass(frozen=True)
class Piece:
    """One piece of a block of calls: a call, the block's end, text that is neither ("bad": it stays
    content), or a piece the text ends inside of ("partial")."""

    kind: Literal["call", "close", "bad", "partial"]
    end: int
    call: ToolCall | None = None
    why: str = ""


def partial_of(text: str, at: int, literals: tuple[str, ...]) -> bool:
    """The text from `at` is a proper beginning of one of the literals (it may yet become it)."""
    tail = text[at:]
    return any(len(tail) < len(lit) and lit.startswith(tail) for lit in literals)


def dsml_piece(text: str, at: int, ctx: ReplyContext, final: bool) -> Piece:
    """The piece of a DSML block at `at` (past whitespace)."""
    m = _CLOSE.match(text, at)
    if m:
        return Piece("close", m.end())
    m = _INVOKE.match(text, at)
    if m:
        return _invoke(text, at, m.end(), ctx)
    if partial_of(text, at, _STARTS):
        return Piece("partial", len(text))
    # text that is no call: as far as the next invoke or the block's end
    stops = [s.start() for s in (_INVOKE.search(text, at), _CLOSE.search(text, at)) if s]
    if stops:
        return Piece("bad", min(stops), why=f"text inside a block of calls: {text[at:min(stops)][:80]!r}")
    if not final:
        return Piece("partial", len(text))
    return Piece("bad", len(text), why=f"text inside a block of calls: {text[at:][:80]!r}")


def _invoke(text: str, at: int, pos: int, ctx: ReplyContext) -> Piece:
    gt = text.find(">", pos)
    if gt < 0:
        return Piece("partial", len(text))
    head = _INVOKE_ATTRS.fullmatch(text, pos, gt + 1)
    if head is None:
        return _bad(text, at, pos)
    name = head.group("name")
    if head.group("closed"):
        return Piece("call", gt + 1, ToolCall(name, "{}", new_call_id()))
    args: dict[str, Any] = {}
    pos = gt + 1
    while True:
        pos = len(text) - len(text[pos:].lstrip())
        end = _INVOKE_END.match(text, pos)
        if end:
            return Piece("call", end.end(), ToolCall(name, dumps(args), new_call_id()))
        param = _PARAM.match(text, pos)
        if param is None:
            if pos == len(text) or partial_of(text, pos, _IN_INVOKE):
                return Piece("partial", len(text))
            return _bad(text, at, pos)
        gt = text.find(">", param.end())
        if gt < 0:
            return Piece("partial", len(text))
        attrs = _PARAM_ATTRS.fullmatch(text, param.end(), gt + 1)
        if attrs is None:
            return _bad(text, at, pos)
        close = _PARAM_END.search(text, gt + 1)
        if close is None:
            return Piece("partial", len(text))
        key = attrs.group("name")
        args[key] = _value(text[gt + 1 : close.start()], attrs.group("string"), ctx.param_schema(name, key))
        pos = close.end()


def _bad(text: str, at: int, where: int) -> Piece:
    """An invoke that does not parse from `where` on: it stays text as far as its closing tag."""
    end = _INVOKE_END.search(text, where)
    if end is None:
        return Piece("partial", len(text))
    return Piece("bad", end.end(), why=f"an invoke that does not parse: {text[at : end.end()][:80]!r}")


def _value(raw: str, string: str | None, schema: dict[str, Any] | None) -> Any:
    """A parameter's value: string="true" is the text itself, unless the tool's schema rules a string out
    (then the text cast to it, as a model that mislabels a number still means the number); string="false"
    is JSON, or the text cast to the schema where it is not JSON; no attribute: the text cast to the
    schema."""
    if string == "true":
        return cast_value(raw, schema) if _not_string(schema) else raw
    if string == "false":
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, RecursionError):
            pass
    return cast_value(raw, schema)


def _not_string(schema: dict[str, Any] | None) -> bool:
    t = schema.get("type") if schema else None
    types = {t} if isinstance(t, str) else {x for x in t if isinstance(x, str)} if isinstance(t, list) else set()
    return bool(types) and "string" not in types

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
writing it).

The call grammar (dsml_grammar) writes the block as the templates render a past call: one tag a line, the
parameters in the tool's properties order (the required ones always), a string as raw text, anything else as
JSON. value_kinds and with_defs are the pieces of a format whose values are text (Kimi K3's too)."""

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from swarmtune.engine.conversation.formats.base import cast_value, dumps
from swarmtune.engine.conversation.formats.grammar import literal, schema_rules, text_without, tool_parts
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
        except (ValueError, RecursionError):  # JSONDecodeError, or an integer past the digit limit
            pass
    return cast_value(raw, schema)


def _not_string(schema: dict[str, Any] | None) -> bool:
    t = schema.get("type") if schema else None
    types = {t} if isinstance(t, str) else {x for x in t if isinstance(x, str)} if isinstance(t, list) else set()
    return bool(types) and "string" not in types


# --- the call grammar, and the pieces a format whose values are text builds its own from

NL = "\n"
_UNCONSTRAINING = {"description", "title", "default", "examples", "$comment", "$schema", "$defs", "definitions",
                   "deprecated", "readOnly", "writeOnly"}


def value_kinds(schema: Any) -> tuple[list[str] | None, bool, bool]:
    """What a parameter's schema lets its value be: (the strings it lists (enum, const), None where it takes
    any string; whether it takes a string at all; whether it takes anything but a string). A schema that
    constrains by other means ($ref, allOf, properties) is left to the schema converter: no string here."""
    if not isinstance(schema, dict) or not set(schema) - _UNCONSTRAINING:
        return None, True, True
    if "const" in schema or isinstance(schema.get("enum"), list):
        values = [schema["const"]] if "const" in schema else schema["enum"]
        strings = [v for v in values if isinstance(v, str)]
        return strings, bool(strings), len(strings) < len(values)
    subs = [s for key in ("anyOf", "oneOf") for s in schema.get(key) or [] if isinstance(s, dict)]
    if subs:
        kinds = [value_kinds(s) for s in subs]
        listed = None if any(k[1] and k[0] is None for k in kinds) else [v for k in kinds for v in k[0] or []]
        return listed, any(k[1] for k in kinds), any(k[2] for k in kinds)
    t = schema.get("type")
    types = {t} if isinstance(t, str) else {x for x in t if isinstance(x, str)} if isinstance(t, list) else set()
    if not types:
        return None, False, True
    return None, "string" in types, bool(types - {"string"})


def with_defs(schema: Any, params: dict[str, Any]) -> dict[str, Any]:
    """A parameter's schema, with the definitions its `$ref`s name (they live at the tool's schema's root)."""
    out = dict(schema) if isinstance(schema, dict) else {}
    for key in ("$defs", "definitions"):
        if key in params and key not in out:
            out[key] = params[key]
    return out


def dsml_grammar(tools: list[dict[str, Any]], parallel: bool, block: str, spaced: bool) -> str:
    """A DSML block of one invoke (or, parallel, one or more) of the tools, in `block`'s name, the tags spaced
    as V4.1's encoder spaces them where `spaced`, as the templates render a past call:

        <｜DSML｜tool_calls>
        <｜DSML｜invoke name="get_weather">
        <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
        </｜DSML｜invoke>
        </｜DSML｜tool_calls>

    It may open with the blank line the templates put before the block (a call held from the reply's first
    token writes it). A string parameter is raw text, holding no closing tag of either spelling (the parser
    ends a value at the first); a listed string (enum) one of them; anything else JSON (string="false"),
    its strings holding no closing tag either."""
    t = TOKEN + (" " if spaced else "")
    param_end = f"</{t}parameter>"
    closers = (f"</{TOKEN}parameter>", f"</{TOKEN} parameter>")
    rules = [text_without("dsml-text", closers, then=param_end),
             text_without("dsml-json-text", closers, json_chars=True)]
    invokes = []
    for i, (name, params) in enumerate(tool_parts(tools)):
        found = params.get("properties")
        props: dict[str, Any] = found if isinstance(found, dict) else {}
        required = set(params.get("required") or [])
        pieces = []
        for j, (key, schema) in enumerate(props.items()):
            listed, may_string, may_other = value_kinds(schema)
            may_other = may_other or not (listed or may_string)  # an empty enum: the converter says what it takes
            as_text = literal(f'<{t}parameter name="{key}" string="true">')
            as_json = literal(f'<{t}parameter name="{key}" string="false">')
            alts = []
            if listed:
                alts.append(f"{as_text} ({' | '.join(map(literal, listed))})")
            elif may_string:
                alts.append(f"{as_text} dsml-text")
            if may_other:
                body, root = schema_rules(with_defs(schema, params), f"t{i}-p{j}", string_text="dsml-json-text")
                rules.append(body)
                alts.append(f"{as_json} {root}")
            rules.append(f"t{i}-p{j} ::= ({' | '.join(alts)}) {literal(param_end + NL)}")
            pieces.append(f"t{i}-p{j}" + ("" if key in required else "?"))
        opener, closer = literal(f'<{t}invoke name="{name}">' + NL), literal(f"</{t}invoke>" + NL)
        # V4's template writes an invoke without arguments with a blank line in it (V3.2's without)
        args = " ".join(pieces)
        if not pieces:
            args = f"{literal(NL)}?"
        elif not any(key in required for key in props):
            args = f"({args} | {literal(NL)})"
        rules.append(f"t{i} ::= {opener} {args} {closer}")
        invokes.append(f"t{i}")
    rules.append("invoke ::= " + " | ".join(invokes))
    calls = "invoke+" if parallel else "invoke"
    rules.append(f"root ::= ({literal(NL)} {literal(NL)}?)? {literal(f'<{t}{block}>' + NL)} {calls} "
                 f"{literal(f'</{t}{block}>')}")
    return "\n".join(rules) + "\n"

"""Gemma 4: a call is `<|tool_call>call:NAME{...}<tool_call|>`, its arguments in Gemma's object notation
rather than JSON: keys bare, strings between `<|"|>` quotes (nothing escaped inside), numbers, true, false
and null as JSON writes them, objects and arrays nested freely:

    <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3,opts:{units:<|"|>metric<|"|>}}<tool_call|>

Reasoning is the thought channel, `<|channel>thought\\n…<channel|>`, before the content or the calls. With
thinking off the template writes an empty one, `<|channel>thought\\n<channel|>`, into the prompt itself and the
reply is content from its first character; with `enable_thinking` the prompt ends at `<|turn>model\\n` and the
model opens the channel. Text before, between and after the calls is content. A `<|channel>` that opens no
thought and a `<channel|>` that closes none are dropped, as llama.cpp drops them.

Sources: the official template (google/gemma-4-31B-it's chat_template.jinja: format_argument, the generation
prompt), the canitoolcall gemma4 fixtures' notes, and llama.cpp's grammar for it (common/parsers/gemma4.cpp,
common/chat-peg-parser.cpp's gemma4_to_json, tests/test-chat.cpp)."""

import json
import re
from typing import Any

from swarmtune.engine.conversation.formats.base import MAX_NUMBER_CHARS, Format, dumps
from swarmtune.engine.conversation.formats.grammar import literal, schema_rules, text_without, tool_parts
from swarmtune.engine.conversation.formats.reply import Reply, ReplyContext, ToolCall, new_call_id
from swarmtune.engine.errors import UserError

CALL_OPEN, CALL_CLOSE, QUOTE = "<|tool_call>", "<tool_call|>", '<|"|>'
CHANNEL_OPEN, CHANNEL_CLOSE, THOUGHT = "<|channel>", "<channel|>", "thought"
PREFIX = "call:"
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_NUMBERISH = re.compile(r"-?\d*(?:\.\d*)?(?:[eE][+-]?\d*)?")  # a number, or what may grow into one
_WORDS = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}


class _Cut(Exception):
    """The text ends inside the value: the model may still be writing it."""


class _Bad(Exception):
    """The value is not Gemma's object notation."""


class Gemma4(Format):
    name = "gemma4"
    markers = (CALL_OPEN, CALL_CLOSE, CHANNEL_OPEN, CHANNEL_CLOSE)
    call_start = CALL_OPEN
    think_open = CHANNEL_OPEN + THOUGHT
    think_close = CHANNEL_CLOSE

    @classmethod
    def for_template(cls, source: str) -> "Gemma4 | None":
        return cls() if CALL_OPEN + PREFIX in source and CHANNEL_OPEN in source else None

    def call_grammar(self, tools: list[dict[str, Any]], parallel: bool) -> str:
        """`<|tool_call>call:NAME{key:value,...}<tool_call|>`, one after another where parallel (as the template
        writes them, nothing between), the arguments in Gemma's notation (_Notation). Under a forced call the
        reply may first think, as the model begins a reply with thinking on: an optional thought channel,
        then the calls at once; lazily the grammar starts at <|tool_call>, past any thought."""
        rules, alternatives = [], []
        for i, (name, params) in enumerate(tool_parts(tools)):
            writer = _Notation(params, f"args{i}")
            if any(k in params for k in ("$ref", "anyOf", "oneOf")):
                args = writer.value(params)  # alternatives of objects, as a tool's parameters are
            elif params.get("type") in ("object", None):
                args = writer.object(writer.merged(params) if "allOf" in params else params)
            else:  # parameters that are no object: Gemma's call still writes one
                args = f"{_G}-object"
            rules += [f"{k} ::= {v}" for k, v in writer.rules.items()]
            alternatives.append(f"{literal(CALL_OPEN + PREFIX + name)} {args} {literal(CALL_CLOSE)}")
        shared = [f"{k} ::= {v}" for k, v in _SHARED.items()]
        shared += [text_without(f"{_G}-text", [QUOTE], then=QUOTE),
                   text_without("thought-text", [CHANNEL_CLOSE], then=CHANNEL_CLOSE)]
        root = (f"root ::= thought? call{'+' if parallel else ''}\n"
                f"thought ::= {literal(CHANNEL_OPEN + THOUGHT)} thought-text {literal(CHANNEL_CLOSE)}\n"
                f"call ::= " + " | ".join(alternatives))
        return "\n".join([*rules, *shared, root]) + "\n"

    def parse(self, text: str, ctx: ReplyContext, final: bool = True) -> Reply:
        content: list[str] = []
        reasoning: list[str] = []
        calls: list[ToolCall] = []
        broken = ""
        pos: int | None = 0
        if self.starts_in_reasoning(ctx):  # the prompt opened the thought channel (a continued reply)
            pos = self._thought(text, 0, ctx, final, reasoning, content, raw_open="")
        while pos is not None and pos < len(text):
            at = _first(text, pos, (CALL_OPEN, CHANNEL_OPEN, CHANNEL_CLOSE))
            if at is None:
                content.append(text[pos:])
                break
            content.append(text[pos:at])
            if text.startswith(CHANNEL_CLOSE, at):  # closes no thought: dropped
                pos = at + len(CHANNEL_CLOSE)
            elif text.startswith(CHANNEL_OPEN, at):
                after = at + len(CHANNEL_OPEN)
                rest = text[after : after + len(THOUGHT)]
                if rest == THOUGHT:
                    pos = self._thought(text, after + len(THOUGHT), ctx, final, reasoning, content,
                                        raw_open=CHANNEL_OPEN + THOUGHT)
                elif not final and THOUGHT.startswith(rest):
                    break  # perhaps the thought channel, half-written
                else:
                    pos = after  # a channel that opens no thought: dropped
            else:
                pos, call, why = _call(text, at, final)
                if call is not None:
                    calls.append(call)
                elif why:
                    broken = broken or why
                    if pos is not None:  # closed but malformed: it stays content, as the model wrote it
                        content.append(text[at:pos])
        out = "".join(content)
        return Reply(out if out.strip() else "", "".join(reasoning).strip(), tuple(calls), broken)

    @staticmethod
    def _thought(text: str, pos: int, ctx: ReplyContext, final: bool, reasoning: list[str], content: list[str],
                 raw_open: str) -> int | None:
        """Reads a thought channel's body from `pos`; where the reply goes on after it (None: at its end)."""
        end = text.find(CHANNEL_CLOSE, pos)
        stop = len(text) if end < 0 else end
        if ctx.reasoning:
            reasoning.append(text[pos:stop].lstrip())  # the whitespace after `thought` only separates it
        else:  # --reasoning-format none: the channel stays content, markers and all
            content.append(raw_open + text[pos:stop] + ("" if end < 0 else CHANNEL_CLOSE))
        return None if end < 0 else end + len(CHANNEL_CLOSE)


def _first(text: str, pos: int, markers: tuple[str, ...]) -> int | None:
    found = [at for at in (text.find(m, pos) for m in markers) if at >= 0]
    return min(found) if found else None


def _call(text: str, at: int, final: bool) -> tuple[int | None, ToolCall | None, str]:
    """(where the reply goes on, the call, why it is none) for the `<|tool_call>` at `at`. The reply goes
    on nowhere (None) where the call is still open: it is neither a call nor content yet."""
    pos = at + len(CALL_OPEN)
    try:
        pos = _expect(text, pos, PREFIX)
        name_end = pos
        while name_end < len(text) and not text[name_end].isspace() and text[name_end] not in "{<":
            name_end += 1
        name = text[pos:name_end]
        if name_end == len(text):
            raise _Cut
        if not name:
            raise _Bad
        args, pos = _object(text, _expect(text, name_end, "{"))
        pos = _space(text, pos)
        if pos == len(text) and final:
            return pos, ToolCall(name, dumps(args), new_call_id()), ""  # the closer was the stop token
        pos = _expect(text, pos, CALL_CLOSE)
        return pos, ToolCall(name, dumps(args), new_call_id()), ""
    except _Cut:
        return None, None, "the reply ended inside a call (max_tokens?)" if final else ""
    except (_Bad, RecursionError):  # not the notation, or nested deeper than Python recurses
        end = text.find(CALL_CLOSE, at)
        if end < 0:  # no end to it yet: what it is may still change
            return None, None, f"a {CALL_OPEN} that is not a call: {text[at:at + 80]!r}" if final else ""
        return end + len(CALL_CLOSE), None, f"a {CALL_OPEN} that is not a call: {text[at:end][:80]!r}"


def _expect(text: str, pos: int, literal: str) -> int:
    if text.startswith(literal, pos):
        return pos + len(literal)
    if literal.startswith(text[pos : pos + len(literal)]):
        raise _Cut  # the rest of text is a prefix of the literal
    raise _Bad


def _space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _value(text: str, pos: int) -> tuple[Any, int]:
    pos = _space(text, pos)
    if pos >= len(text):
        raise _Cut
    if text.startswith("{", pos):
        return _object(text, pos + 1)
    if text.startswith("[", pos):
        return _array(text, pos + 1)
    if QUOTE.startswith(text[pos : pos + len(QUOTE)]):
        return _string(text, pos)
    m = _NUMBERISH.match(text, pos)
    end = m.end() if m else pos
    if end > pos:
        if end == len(text):
            raise _Cut  # more digits may follow
        number = text[pos:end]
        if not _NUMBER.fullmatch(number) or len(number) > MAX_NUMBER_CHARS:  # past int()'s digit limit
            raise _Bad
        return (float(number) if any(c in number for c in ".eE") else int(number)), end
    for word, value in _WORDS.items():
        if text.startswith(word, pos):
            if pos + len(word) == len(text):
                raise _Cut
            return value, pos + len(word)
        if len(text) - pos < len(word) and word.startswith(text[pos:]):
            raise _Cut
    raise _Bad


def _string(text: str, pos: int) -> tuple[str, int]:
    pos = _expect(text, pos, QUOTE)
    end = text.find(QUOTE, pos)
    if end < 0:
        raise _Cut
    return text[pos:end], end + len(QUOTE)


def _object(text: str, pos: int) -> tuple[dict[str, Any], int]:
    """The members of an object whose `{` ends before `pos`, and where the object ends."""
    out: dict[str, Any] = {}
    pos = _space(text, pos)
    if text.startswith("}", pos):
        return out, pos + 1
    while True:
        pos = _space(text, pos)
        if text.startswith(QUOTE, pos):  # a key written quoted, as the template writes a declaration's
            key, pos = _string(text, pos)
        else:
            colon = pos
            while colon < len(text) and text[colon] not in ":}":
                colon += 1
            if colon == len(text):
                raise _Cut
            key = text[pos:colon].strip()
            if not key and text[colon] == "}" and out:  # a trailing comma
                return out, colon + 1
            if not key or text[colon] == "}":
                raise _Bad
            pos = colon
        pos = _expect(text, _space(text, pos), ":")
        out[key], pos = _value(text, pos)
        pos = _space(text, pos)
        if pos >= len(text):
            raise _Cut
        if text[pos] == "}":
            return out, pos + 1
        pos = _expect(text, pos, ",")


def _array(text: str, pos: int) -> tuple[list[Any], int]:
    """The items of an array whose `[` ends before `pos`, and where the array ends."""
    out: list[Any] = []
    pos = _space(text, pos)
    if text.startswith("]", pos):
        return out, pos + 1
    while True:
        item, pos = _value(text, pos)
        out.append(item)
        pos = _space(text, pos)
        if pos >= len(text):
            raise _Cut
        if text[pos] == "]":
            return out, pos + 1
        pos = _expect(text, pos, ",")


# The grammar: a call in Gemma's own notation, its arguments held to the tool's schema. llama.cpp's converter
# writes JSON, and Gemma's notation is not JSON (bare keys, <|"|> quotes), so the notation is written here from
# the schema; only numbers, which the two write alike, come from the converter (its bounds on digits).

_G = "g4"  # the rules every call shares: a string, any value (a schema that says nothing), the thought
_SHARED = {
    f"{_G}-string": f'{literal(QUOTE)} {_G}-text {literal(QUOTE)}',
    f"{_G}-number": '"-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,16})?',
    f"{_G}-value": f'{_G}-string | {_G}-number | "true" | "false" | "null" | {_G}-object | {_G}-array',
    f"{_G}-object": f'"{{" ({_G}-member ("," {_G}-member)*)? "}}"',
    f"{_G}-member": f'{_G}-key ":" {_G}-value',
    # a bare key the parser reads back whole: no `:` or `}` (they end it), no `<` (a <|"|> would quote it), no
    # blank at either end (it is stripped); no `,`, which would read as a member left without its value
    f"{_G}-key": r'[^:}<,\x00-\x20] ([^:}<,\n]* [^:}<,\x00-\x20])?',
    f"{_G}-array": f'"[" ({_G}-value ("," {_G}-value)*)? "]"',
}


class _Notation:
    """GBNF for values in Gemma's notation that validate against JSON schemas, as the template writes them
    (format_argument): keys bare (quoted only where a bare one would not read back), strings between <|"|>
    quotes, an object's properties sorted (or in the schema's order). What it cannot hold to: a string's
    length, pattern or format (any text but <|"|>), the number bounds the converter drops, prefixItems,
    uniqueItems, not, if/then and dependencies; a schema part it does not know is any value there."""

    def __init__(self, root: dict[str, Any], prefix: str) -> None:
        self.root, self.prefix = root, prefix
        self.rules: dict[str, str] = {}
        self.refs: dict[str, str] = {}
        self.numbers = 0

    def _rule(self, body: str) -> str:
        name = f"{self.prefix}-{len(self.rules)}"
        self.rules[name] = body
        return name

    def value(self, schema: Any) -> str:
        """A rule name (or a shared one) for the values `schema` allows."""
        if not isinstance(schema, dict) or not schema:
            return f"{_G}-value"
        if "$ref" in schema:
            return self._ref(str(schema["$ref"]))
        if "const" in schema:
            return self._rule(literal(notation(schema["const"])))
        if "enum" in schema and isinstance(schema["enum"], list):
            if not schema["enum"]:
                raise UserError("a tool's parameters schema has an enum that allows no value", field="tools")
            return self._rule(" | ".join(literal(notation(v)) for v in schema["enum"]))
        if schema.get("nullable") is True:  # OpenAPI's null, which Gemma's templates write out
            return self._rule(f'{self.value({k: v for k, v in schema.items() if k != "nullable"})} | "null"')
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list) and schema[key]:
                return self._rule(" | ".join(self.value(s) for s in schema[key]))
        if isinstance(schema.get("allOf"), list):
            return self.value(self.merged(schema))
        kind = schema.get("type")
        if isinstance(kind, list):
            return self._rule(" | ".join(self.value({**schema, "type": t}) for t in kind) or f"{_G}-value")
        if kind is None:
            kind = "object" if "properties" in schema else "array" if "items" in schema else None
        if kind == "string":
            return f"{_G}-string"
        if kind in ("integer", "number"):
            self.numbers += 1
            body, root = schema_rules(schema, f"{self.prefix}-n{self.numbers}")  # JSON's numbers are Gemma's
            self.rules.update(_rules_of(body))
            return root
        if kind == "boolean":
            return self._rule('"true" | "false"')
        if kind == "null":
            return self._rule('"null"')
        if kind == "object":
            return self.object(schema)
        if kind == "array":
            return self._array(schema)
        return f"{_G}-value"

    def object(self, schema: dict[str, Any]) -> str:
        """`{key:value,...}`, each required property present; others only where additionalProperties allows
        them, after those. In the template's order (Jinja's dictsort: by name, case aside), or in the schema's,
        as models also write them (llama.cpp's Gemma 4 cases do)."""
        props = dict(schema["properties"]) if isinstance(schema.get("properties"), dict) else {}
        extra = schema.get("additionalProperties", not props)  # without properties: any members
        required = {str(k) for k in schema.get("required") or []}
        props.update({k: {} for k in sorted(required) if k not in props})  # required, yet said nothing of
        if not props and extra in (True, None):
            return f"{_G}-object"
        values = {k: self.value(v) for k, v in props.items()}
        more = self._rule(f'{_G}-key ":" {self.value(extra if isinstance(extra, dict) else {})}') \
            if extra is True or isinstance(extra, dict) else None
        orders = [sorted(props, key=str.lower), list(props)]
        inners = [self._members(order, values, required, more) for order in orders[: 1 if orders[0] == orders[1]
                                                                                     else 2]]
        if inners[0] is None:
            return self._rule('"{" "}"')
        either = inners[0] if len(inners) == 1 else self._rule(" | ".join(str(i) for i in inners))
        return self._rule(f'"{{" {either}{"" if required else "?"} "}}"')

    def _members(self, order: list[str], values: dict[str, str], required: set[str], more: str | None) -> str | None:
        """A rule for one or more members, the properties in `order`, then any others: None where there can
        be none. after(i): the members from the i-th on, each after a comma; first(i): those, the first one
        without its comma."""
        members = [f'{literal(key_notation(k) + ":")} {values[k]}' for k in order]
        n = len(members)
        after = [" ".join([f'"," {m}' if order[j] in required else f'("," {m})?'
                           for j, m in enumerate(members) if j >= i] + ([f'("," {more})*'] if more else []))
                 for i in range(n + 1)]
        first: list[str | None] = [None] * (n + 1)
        first[n] = self._rule(f'{more} ("," {more})*') if more else None
        for i in range(n - 1, -1, -1):
            alts = [f"{members[i]} {after[i + 1]}".strip()]
            if order[i] not in required and first[i + 1] is not None:
                alts.append(str(first[i + 1]))
            first[i] = self._rule(" | ".join(alts))
        return first[0]

    def _array(self, schema: dict[str, Any]) -> str:
        item = self.value(schema.get("items")) if isinstance(schema.get("items"), dict) else f"{_G}-value"
        low = int(schema.get("minItems") or 0)
        high = schema.get("maxItems")
        more = f"{{{max(low - 1, 0)},{int(high) - 1}}}" if isinstance(high, int) and high >= 1 else \
            f"{{{max(low - 1, 0)},}}"
        if isinstance(high, int) and high < 1:
            return self._rule('"[" "]"')
        items = f'{item} ("," {item}){more}'
        return self._rule(f'"[" {items} "]"' if low else f'"[" ({items})? "]"')

    def _ref(self, ref: str) -> str:
        if ref in self.refs:  # a recursive schema refers to the rule being written
            return self.refs[ref]
        if not ref.startswith("#"):
            raise UserError(f"a tool's parameters schema refers outside itself ({ref})", field="tools")
        target: Any = self.root
        for part in ref[1:].split("/")[1:] if ref != "#" else []:
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                raise UserError(f"a tool's parameters schema has no {ref}", field="tools")
            target = target[part]
        name = self.refs[ref] = f"{self.prefix}-ref{len(self.refs)}"
        self.rules[name] = self.value(target)
        return name

    def merged(self, schema: dict[str, Any]) -> dict[str, Any]:
        """allOf as one schema: the parts' properties and required members together (as the converter merges
        it); what else a part says is the last word on it."""
        out: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
        props, required = dict(out.get("properties") or {}), list(out.get("required") or [])
        for part in schema["allOf"]:
            while isinstance(part, dict) and "$ref" in part and str(part["$ref"]).startswith("#/"):
                target: Any = self.root
                for key in str(part["$ref"])[2:].split("/"):
                    target = target.get(key) if isinstance(target, dict) else None
                part = target
            if not isinstance(part, dict):
                continue
            props.update(part.get("properties") or {})
            required += list(part.get("required") or [])
            out.update({k: v for k, v in part.items() if k not in ("properties", "required")})
        if props:
            out["properties"], out["required"], out["type"] = props, required, "object"
        return out


def _rules_of(gbnf: str) -> dict[str, str]:
    out = {}
    for line in gbnf.splitlines():
        name, _, body = line.partition(" ::= ")
        out[name.strip()] = body
    return out


def notation(value: Any) -> str:
    """A JSON value as the template writes it (format_argument), and as _value reads it back."""
    if isinstance(value, str):
        if QUOTE in value:
            raise UserError(f"a tool's schema holds a string Gemma cannot quote: {value[:40]!r}", field="tools")
        return QUOTE + value + QUOTE
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        if value != value or value in (float("inf"), float("-inf")):
            raise UserError("a tool's schema holds a number JSON has no word for", field="tools")
        return json.dumps(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{key_notation(str(k))}:{notation(v)}" for k, v in
                              sorted(value.items(), key=lambda kv: str(kv[0]).lower())) + "}"
    if isinstance(value, list):
        return "[" + ",".join(notation(v) for v in value) + "]"
    raise UserError(f"a tool's schema holds a value that is no JSON: {value!r}", field="tools")


def key_notation(key: str) -> str:
    """A key bare, as the template writes it, where _object reads it back whole; else between <|"|> quotes."""
    if key and key == key.strip() and ":" not in key and "}" not in key and not key.startswith(QUOTE):
        return key
    if QUOTE in key:
        raise UserError(f"a tool's schema has a key Gemma cannot quote: {key[:40]!r}", field="tools")
    return QUOTE + key + QUOTE


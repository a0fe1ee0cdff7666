"""Kimi (Moonshot AI). Two formats that share nothing but the name.

K2 (Kimi-K2-Instruct, K2-Thinking, K2.5, K2.6): the calls come in one section after the content, each call's
id naming its function, the arguments JSON:
    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>
    {"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>
The thinking models reason first in `<think>…</think>`; K2.6's template opens it in the prompt.

K3: XTML, tags written with control tokens, `<|open|>tag attr="v"…<|sep|>` and `<|close|>tag<|sep|>`. A reply
is a think channel, a response channel, then a tools element, each argument a tag of its own whose body is
the value as text (a string as is, anything else as JSON):
    <|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|><|open|>argument key="city"
    type="string"<|sep|>Paris<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>
Its template opens the think channel in the prompt (`thinking`, default true) or, with thinking off, the
response channel.

From the chat templates llama.cpp vendors (Kimi-K2-Instruct, Kimi-K2-Thinking, Kimi-K3), read as llama.cpp's
kimi_k2 / kimi_k3 parsers and vLLM's kimi_k2 tool parser read them. A prompt the parse is not told of
(prompt_tail "") is taken to end as the template's own generation prompt does by default: inside the thinking
block, for the thinking models."""

from typing import Any

from swarmtune.engine.conversation.formats.base import Format, cast_value, dumps
from swarmtune.engine.conversation.formats.deepseek_dsml import value_kinds, with_defs
from swarmtune.engine.conversation.formats.grammar import literal, schema_rules, text_without, tool_parts
from swarmtune.engine.conversation.formats.llama3 import BAD, CUT, load_json, scan_json, skip_ws
from swarmtune.engine.conversation.formats.reply import Reply, ReplyContext, ToolCall, new_call_id

SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, ARG_BEGIN, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

# K3's XTML
OPEN, CLOSE, SEP, EOM = "<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"
MSG_START, MSG_END = OPEN + 'message role="assistant"' + SEP, CLOSE + "message" + SEP
K3_THINK, K3_THINK_END = OPEN + "think" + SEP, CLOSE + "think" + SEP
RESPONSE, RESPONSE_END = OPEN + "response" + SEP, CLOSE + "response" + SEP
TOOLS, TOOLS_END = OPEN + "tools" + SEP, CLOSE + "tools" + SEP
K3_CALL, K3_CALL_END = OPEN + "call ", CLOSE + "call" + SEP
ARGUMENT, ARGUMENT_END = OPEN + "argument ", CLOSE + "argument" + SEP
JSON_ARGS, JSON_ARGS_END = OPEN + "json", CLOSE + "json" + SEP

_CLOSED, _OPEN, _BAD = "closed", "open", "bad"
_CUT_SHORT = "the reply ended inside a call (max_tokens?)"


def _first(text: str, needles: tuple[str, ...], at: int) -> tuple[int, str]:
    """The first of `needles` in `text` from `at`: (where, which), or (-1, "")."""
    best, which = -1, ""
    for n in needles:
        i = text.find(n, at)
        if i >= 0 and (best < 0 or i < best):
            best, which = i, n
    return best, which


def _half_written(text: str, at: int, markers: tuple[str, ...]) -> bool:
    """The text from `at` is the start of one of `markers`, cut off by the text's end."""
    tail = text[at:] if len(text) - at < max(len(m) for m in markers) else ""
    return bool(tail) and any(m.startswith(tail) for m in markers)


class Kimi(Format):
    """K2's format (see the module's docstring); for_template gives K3's where the template is K3's."""

    name = "kimi"
    markers = (SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARG_BEGIN, CALL_END, THINK_OPEN, THINK_CLOSE)
    call_start = CALL_BEGIN  # not the section's opener: the model sometimes leaves it out (llama.cpp's trigger too)

    def __init__(self, thinking: bool = False) -> None:
        self.thinking = thinking  # a thinking model's template (K2-Thinking, K2.6): it reasons by default

    def call_grammar(self, tools: list[dict[str, Any]], parallel: bool) -> str:
        """`<|tool_call_begin|>functions.NAME:N<|tool_call_argument_begin|>{...}<|tool_call_end|>`, one call
        (or, parallel, one or more), and the section's closer. A call held from the reply's first token may
        open the section first, as the model writes it; a lazy one starts at the call, the section's opener
        (if any) written before the trigger (as llama.cpp's own grammar for K2 does)."""
        rules, calls = [], []
        for i, (name, params) in enumerate(tool_parts(tools)):
            body, args = schema_rules(params, f"args{i}")  # the parser takes raw control characters too
            rules.append(body)
            calls.append(f'{literal(f"{CALL_BEGIN}functions.{name}:")} [0-9]+ {literal(ARG_BEGIN)} {args} '
                         f"{literal(CALL_END)}")
        rules.append("call ::= " + " | ".join(calls))
        many = "call+" if parallel else "call"
        rules.append(f"root ::= {literal(SECTION_BEGIN)}? {many} {literal(SECTION_END)}?")
        return "\n".join(rules) + "\n"

    @classmethod
    def for_template(cls, source: str) -> "Format | None":
        if SECTION_BEGIN in source and CALL_BEGIN in source:
            return cls(thinking=THINK_OPEN in source)
        if OPEN in source and CLOSE in source and EOM in source:
            return KimiK3()
        return None

    def starts_in_reasoning(self, ctx: ReplyContext) -> bool:
        tail = ctx.prompt_tail.rstrip()
        if tail.endswith(THINK_OPEN):
            return True
        return self.thinking and not tail  # untold: the template's default, a thinking model thinks

    def split_reasoning(self, text: str, ctx: ReplyContext) -> tuple[str, str]:
        if not ctx.reasoning:
            return "", text
        stripped = text.lstrip()
        if stripped.startswith(THINK_OPEN):
            body = stripped[len(THINK_OPEN):]
        elif stripped and THINK_OPEN.startswith(stripped):
            return "", ""  # maybe the opener, half-written
        elif self.starts_in_reasoning(ctx):
            body = text
        else:
            return "", text
        # the model may go on to its calls without closing its reasoning (llama.cpp's parser allows it)
        end, which = _first(body, (THINK_CLOSE, SECTION_BEGIN, CALL_BEGIN), 0)
        if end < 0:
            return body.lstrip(), ""
        rest = body[end + len(THINK_CLOSE):] if which == THINK_CLOSE else body[end:]
        return body[:end].strip(), rest.lstrip()

    def parse(self, text: str, ctx: ReplyContext, final: bool = True) -> Reply:
        reasoning, rest = self.split_reasoning(text, ctx)
        calls: list[ToolCall] = []
        content: list[str] = []
        pos = scan = 0
        broken = ""
        while (start := _first(rest, (SECTION_BEGIN, CALL_BEGIN), scan))[0] >= 0:
            at, which = start
            explicit = which == SECTION_BEGIN
            end, why = _k2_section(rest, at + len(SECTION_BEGIN) if explicit else at, explicit, final, calls)
            broken = broken or why
            if end < 0:  # a call still being written: what follows is not content yet
                content.append(rest[pos:at])
                break
            if end == at:  # no call after all: the marker stays content, as the model wrote it
                scan = at + len(which)
                continue
            content.append(rest[pos:at])
            pos = scan = end
        else:
            content.append(rest[pos:])
        out = "".join(content)
        return Reply(out if out.strip() else "", reasoning, tuple(calls), broken)


def _k2_section(text: str, at: int, explicit: bool, final: bool, calls: list[ToolCall]) -> tuple[int, str]:
    """Reads a section's calls into `calls`: (where the section ends, why a call in it failed). -1 where the
    text ends inside a call. Text between calls inside a section is no content; a section the model did not
    open (a bare <|tool_call_begin|>) ends at the first text that is not a call."""
    i, broken = at, ""
    while True:
        j = skip_ws(text, i)
        if explicit:
            j, which = _first(text, (CALL_BEGIN, SECTION_END), i)
            if j < 0:  # the section is still open; only a marker may end its noise
                return (len(text) if final else -1), broken
            if which == SECTION_END:
                return j + len(SECTION_END), broken
        elif text.startswith(SECTION_END, j):
            return j + len(SECTION_END), broken
        elif not text.startswith(CALL_BEGIN, j):
            if not final and _half_written(text, j, (CALL_BEGIN, SECTION_END)):
                return -1, broken
            return i, broken
        kind, call, end = _k2_call(text, j + len(CALL_BEGIN), final)
        if kind == _OPEN:
            return -1, broken or (_CUT_SHORT if final else "")
        if kind == _BAD:
            broken = broken or f"a call that does not parse: {text[j:j + 80]!r}"
            if not explicit:
                return j, broken  # stays content, as the model wrote it
            i = j + len(CALL_BEGIN)
            continue
        assert call is not None
        calls.append(call)
        i = end


def _k2_call(text: str, at: int, final: bool) -> tuple[str, ToolCall | None, int]:
    """The call whose id starts at `at`: (_CLOSED, it, where it ends), (_OPEN, None, -1) where the text ends
    first, or (_BAD, None, -1)."""
    args_at, which = _first(text, (ARG_BEGIN, CALL_BEGIN, CALL_END, SECTION_END), at)
    if args_at < 0:
        return _OPEN, None, -1
    if which != ARG_BEGIN:
        return _BAD, None, -1
    name = _k2_name(text[at:args_at])
    i = skip_ws(text, args_at + len(ARG_BEGIN))
    if i == len(text):
        return _OPEN, None, -1
    end = scan_json(text, i) if text[i] == "{" else BAD
    if end == CUT:
        return _OPEN, None, -1
    args = load_json(text[i:end]) if end != BAD else None
    if not name or not isinstance(args, dict):
        return _BAD, None, -1
    k = skip_ws(text, end)
    if text.startswith(CALL_END, k):
        k += len(CALL_END)
    elif k == len(text) or _half_written(text, k, (CALL_END, CALL_BEGIN, SECTION_END)):
        if not final:
            return _OPEN, None, -1  # its closer may be on its way
    elif not text.startswith((CALL_BEGIN, SECTION_END), k):
        return _BAD, None, -1
    return _CLOSED, ToolCall(name, dumps(args), new_call_id()), k


def _k2_name(call_id: str) -> str:
    """The function a K2 call id names: `functions.get_weather:0` (the prefix sometimes left out)."""
    name = call_id.strip()
    if name.startswith("functions."):
        name = name[len("functions."):]
    head, colon, idx = name.rpartition(":")
    return head if colon and idx.isdigit() else name


class KimiK3(Format):
    """K3's XTML (see the module's docstring)."""

    name = "kimi"
    markers = (MSG_START, MSG_END, K3_THINK, K3_THINK_END, RESPONSE, RESPONSE_END, TOOLS, TOOLS_END, K3_CALL,
               K3_CALL_END, ARGUMENT, ARGUMENT_END, JSON_ARGS, JSON_ARGS_END, EOM, OPEN, CLOSE, SEP)
    call_start = TOOLS
    think_open = K3_THINK
    think_close = K3_THINK_END

    def call_grammar(self, tools: list[dict[str, Any]], parallel: bool) -> str:
        """The tools element of one call (or, parallel, one or more), as the template renders a past call:

            <|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|><|open|>argument key="city"
            type="string"<|sep|>Paris<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>

        then the message's end, as llama.cpp's K3 grammar ends it. The arguments in the tool's properties
        order, the required ones always; a string is raw text holding no argument closer (a listed one, enum,
        one of them), anything else JSON, its strings holding no closer either. A call held from the reply's
        first token may close an empty response channel first, as the model writes it before its tools."""
        rules = [text_without("k3-text", (ARGUMENT_END,), then=ARGUMENT_END),
                 text_without("k3-json-text", (ARGUMENT_END,), json_chars=True)]
        calls = []
        for i, (name, params) in enumerate(tool_parts(tools)):
            found = params.get("properties")
            props: dict[str, Any] = found if isinstance(found, dict) else {}
            required = set(params.get("required") or [])
            pieces = []
            for j, (key, schema) in enumerate(props.items()):
                listed, may_string, may_other = value_kinds(schema)
                may_other = may_other or not (listed or may_string)  # an empty enum: the converter says
                as_text, alts = literal('string"' + SEP), []
                if listed:
                    alts.append(f"{as_text} ({' | '.join(map(literal, listed))})")
                elif may_string:
                    alts.append(f"{as_text} k3-text")
                if may_other:
                    # where a string is allowed too, a JSON string would be read back as its text, quotes and all
                    json_schema = _no_strings(schema) if may_string else schema
                    body, root = schema_rules(with_defs(json_schema, params), f"t{i}-a{j}", string_text="k3-json-text")
                    rules.append(body)
                    types = " | ".join(literal(t + '"' + SEP) for t in _xtml_types(schema))
                    alts.append(f"({types}) {root}")
                head = literal(f'{ARGUMENT}key="{_escape_attr(key)}" type="')
                rules.append(f"t{i}-a{j} ::= {head} ({' | '.join(alts)}) {literal(ARGUMENT_END)}")
                pieces.append(f"t{i}-a{j}" + ("" if key in required else "?"))
            opener, head_end = literal(f'{K3_CALL}tool="{_escape_attr(name)}" index="'), literal('"' + SEP)
            rules.append(f"t{i} ::= {opener} [0-9]+ {head_end} {' '.join(pieces)} {literal(K3_CALL_END)}")
            calls.append(f"t{i}")
        rules.append("call ::= " + " | ".join(calls))
        many = "call+" if parallel else "call"
        rules.append(f"root ::= ({literal(RESPONSE)}? {literal(RESPONSE_END)})? {literal(TOOLS)} {many} "
                     f"{literal(TOOLS_END)} ({literal(MSG_END)} {literal(EOM)}?)?")
        return "\n".join(rules) + "\n"

    @classmethod
    def for_template(cls, source: str) -> "KimiK3 | None":
        return cls() if OPEN in source and CLOSE in source and EOM in source else None

    def starts_in_reasoning(self, ctx: ReplyContext) -> bool:
        tail = ctx.prompt_tail.rstrip()
        return tail.endswith(K3_THINK) or not tail  # untold: the template's default, `thinking` true

    def _think(self, text: str, ctx: ReplyContext) -> tuple[str, int]:
        """(the think channel's text, where the rest starts)."""
        i = len(MSG_START) if text.startswith(MSG_START) else 0
        inside = self.starts_in_reasoning(ctx)
        if text.startswith(K3_THINK, i):
            i, inside = i + len(K3_THINK), True
        if not inside:
            return "", i
        # the channel ends at its closer, or where the model goes on to its response without one
        end, which = _first(text, (K3_THINK_END, RESPONSE), i)
        if end < 0:
            return text[i:], len(text)
        return text[i:end], end + len(K3_THINK_END) if which == K3_THINK_END else end

    def split_reasoning(self, text: str, ctx: ReplyContext) -> tuple[str, str]:
        think, rest = self._think(text, ctx)
        if not ctx.reasoning:
            return "", think + text[rest:]
        return think.strip() if rest < len(text) else think.lstrip(), text[rest:]

    def parse_without_calls(self, text: str, ctx: ReplyContext, final: bool = True) -> Reply:
        # its reasoning and its answer are messages of their own, not a block before the rest: read them as
        # ever, and leave out what the model addressed to a tool no request offered
        r = self.parse(text, ctx, final)
        return Reply(r.content, r.reasoning)

    def parse(self, text: str, ctx: ReplyContext, final: bool = True) -> Reply:
        think, i = self._think(text, ctx)
        reasoning = (think.strip() if i < len(text) else think.lstrip()) if ctx.reasoning else ""
        content = [] if ctx.reasoning else [think]
        calls: list[ToolCall] = []
        broken = ""
        if text.startswith(RESPONSE, i):
            i += len(RESPONSE)
        while i < len(text):
            if text.startswith(TOOLS, i):
                i, why = _k3_tools(text, i + len(TOOLS), ctx, final, calls)
                broken = broken or why
                if i < 0:
                    break
                continue
            skip = next((m for m in (RESPONSE_END, MSG_END, EOM) if text.startswith(m, i)), "")
            if skip:
                i += len(skip)
                continue
            end, _ = _first(text, (RESPONSE_END, TOOLS, MSG_END, EOM), i)
            end = len(text) if end < 0 else end
            content.append(text[i:end])
            i = end
        out = "".join(content)
        return Reply(out if out.strip() else "", reasoning, tuple(calls), broken)


def _k3_tools(text: str, at: int, ctx: ReplyContext, final: bool, calls: list[ToolCall]) -> tuple[int, str]:
    """Reads the tools element's calls into `calls`: (where it ends, why a call in it failed); -1 where the
    text ends inside a call. What is not a call between its calls is no content."""
    i, broken = at, ""
    while True:
        j, which = _first(text, (K3_CALL, TOOLS_END), i)
        if j < 0:
            return (len(text) if final else -1), broken
        if which == TOOLS_END:
            return j + len(TOOLS_END), broken
        kind, call, end = _k3_call(text, j, ctx)
        if kind == _OPEN:
            return -1, broken or (_CUT_SHORT if final else "")
        if kind == _BAD:
            broken = broken or f"a call that does not parse: {text[j:j + 80]!r}"
            after, _ = _first(text, (K3_CALL_END, TOOLS_END), j + len(K3_CALL))
            if after < 0:
                return (len(text) if final else -1), broken
            i = after + len(K3_CALL_END) if text.startswith(K3_CALL_END, after) else after
            continue
        assert call is not None
        calls.append(call)
        i = end


def _attrs(text: str) -> dict[str, str]:
    """An XTML tag's attributes, `k="v"` each, & and " escaped in the value as the template escapes them."""
    out: dict[str, str] = {}
    i = 0
    while (eq := text.find('="', i)) >= 0:
        key = text[i:eq].strip()
        close = text.find('"', eq + 2)
        if close < 0:
            break
        out[key] = text[eq + 2:close].replace("&quot;", '"').replace("&amp;", "&")
        i = close + 1
    return out


def _k3_call(text: str, at: int, ctx: ReplyContext) -> tuple[str, ToolCall | None, int]:
    """The call whose tag opens at `at`: (_CLOSED, it, where it ends), (_OPEN, None, -1) where the text
    ends first, or (_BAD, None, -1)."""
    head_end = text.find(SEP, at)
    if head_end < 0:
        return _OPEN, None, -1
    name = _attrs(text[at + len(K3_CALL):head_end]).get("tool", "")
    i = head_end + len(SEP)
    args: dict[str, Any] = {}
    while True:
        if text.startswith(K3_CALL_END, i):
            if not name:
                return _BAD, None, -1
            return _CLOSED, ToolCall(name, dumps(args), new_call_id()), i + len(K3_CALL_END)
        if text.startswith(ARGUMENT, i) or text.startswith(JSON_ARGS, i):
            is_json = text.startswith(JSON_ARGS, i)
            tag_end = text.find(SEP, i)
            if tag_end < 0:
                return _OPEN, None, -1
            attrs = _attrs(text[i + (len(JSON_ARGS) if is_json else len(ARGUMENT)):tag_end])
            value, i = _k3_value(text, tag_end + len(SEP), JSON_ARGS_END if is_json else ARGUMENT_END)
            if value is None:
                return _OPEN, None, -1
            if is_json:
                whole = load_json(value.strip())
                if not isinstance(whole, dict):
                    return _BAD, None, -1
                args.update(whole)
            elif "key" not in attrs:
                return _BAD, None, -1
            else:
                args[attrs["key"]] = _k3_cast(value, attrs.get("type", ""), ctx.param_schema(name, attrs["key"]))
            continue
        if i >= len(text) or _half_written(text, i, (K3_CALL_END, ARGUMENT, JSON_ARGS)):
            return _OPEN, None, -1
        return _BAD, None, -1


def _k3_value(text: str, at: int, closer: str) -> tuple[str | None, int]:
    """An argument's body from `at`, and where the element ends. Values are raw text, so a closer may be part
    of one: the element ends at the first closer that a next argument or the call's end follows. None
    where the text ends before that is known."""
    follows = (ARGUMENT + 'key="', JSON_ARGS, K3_CALL_END)
    search = at
    while (end := text.find(closer, search)) >= 0:
        after = end + len(closer)
        if text.startswith(follows, after):
            return text[at:end], after
        if after == len(text) or _half_written(text, after, follows):
            return None, -1
        search = after
    return None, -1


def _k3_cast(value: str, written: str, schema: dict[str, Any] | None) -> Any:
    """A value as the tool's schema types it, else as the type the model wrote in the tag."""
    if schema is not None:
        return cast_value(value, schema)
    if written == "string":
        return value
    parsed = load_json(value.strip())
    return value if parsed is None and value.strip() != "null" else parsed


def _escape_attr(value: str) -> str:
    """An XTML attribute's value as the template escapes it (and _attrs reads it back)."""
    return value.replace("&", "&amp;").replace('"', "&quot;")


_XTML_TYPES = {"integer": "number", "number": "number", "boolean": "boolean", "null": "null", "object": "object",
               "array": "array"}


def _xtml_types(schema: Any) -> list[str]:
    """The `type` attributes a value of this schema's other than string may carry (the template's names of
    JSON's types; the parser reads the value by the schema, so this is the model's cue, not the parser's)."""
    if isinstance(schema, dict):
        t = schema.get("type")
        types = [t] if isinstance(t, str) else t if isinstance(t, list) else []
        for key in ("anyOf", "oneOf"):
            for sub in schema.get(key) or []:
                types = types + [x for x in _xtml_types(sub) if x not in types]
        named = list(dict.fromkeys(_XTML_TYPES[x] for x in types if x in _XTML_TYPES))
        if named:
            return named
    return list(dict.fromkeys(_XTML_TYPES.values()))


def _no_strings(schema: Any) -> Any:
    """A schema that takes a string and more, less the string: the JSON a K3 argument's value may be that
    cast_value does not read back as text."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    t = out.get("type")
    if isinstance(t, list):
        out["type"] = [x for x in t if x != "string"]
    if isinstance(out.get("enum"), list):
        out["enum"] = [v for v in out["enum"] if not isinstance(v, str)]
    for key in ("anyOf", "oneOf"):
        if isinstance(out.get(key), list):
            out[key] = [_no_strings(sub) for sub in out[key] if value_kinds(sub)[2]]
    return out

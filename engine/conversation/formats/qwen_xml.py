"""Qwen's XML tool calls (Qwen3-Coder, Qwen3.5/3.6/3.8; also Nemotron 3 Nano and StepFun 3.5, whose templates
write the same): one block a call, each parameter a tagged value written as text, after an optional
`<think>…</think>`:

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

From the templates' own rendering of an assistant's calls (models/templates/Qwen3-Coder.jinja, Qwen3.5-4B.jinja
in the pinned llama.cpp), read as llama.cpp's Qwen3-Coder parser (common/parsers/qwen3-coder.cpp) and vLLM's
qwen3_coder tool parser read it. A value is the text between `<parameter=P>\\n` and `\\n</parameter>`: one
newline on each side is markup, the rest (indentation, a trailing newline) is the value's. A value is cast to
the parameter's schema type (the template writes numbers, booleans and null bare, objects and arrays as
JSON). What ends a value is structure, not the first closing tag: a `</parameter>` followed by the next
`<parameter=…>` or by `</function></tool_call>`, so a value may hold the tags as text. A value the model left
unclosed ends at the next parameter on a line of its own, or at `</function></tool_call>`, as vLLM reads it.

Qwen3.5's template opens the thinking block in the prompt (`<think>\\n`), so its replies start in reasoning;
a call ends the reasoning even where the model never wrote `</think>` (llama.cpp does the same). Qwen3-Coder,
which does not think, sometimes leaves out the `<tool_call>` opener: a `<function=NAME>` of an offered tool
opens a call there (llama.cpp's Qwen3-Coder triggers).

The call grammar writes the template's layout, the parameters in the schema's order (llama.cpp's takes the
required ones in any order). A string value is any text but what the parser would end it at (grammar.text_without:
an automaton over the closers, so code full of `<` and even a `</parameter>` stays writable); any other value is
the JSON its schema allows, as cast_value reads it back.

The scan (TaggedCalls) and the grammar's text values are shared with GLM's format (formats/glm.py), whose calls
are tagged the same way."""

import re
from abc import abstractmethod
from typing import Any, ClassVar

from swarmtune.engine.conversation.formats.base import Format, _types, cast_value, dumps
from swarmtune.engine.conversation.formats.grammar import (
    SPACES,
    Closer,
    literal,
    schema_rules,
    text_without,
    tool_parts,
)
from swarmtune.engine.conversation.formats.reply import Reply, ReplyContext, ToolCall, new_call_id
from swarmtune.engine.errors import UserError

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"

# what a call's reading comes to: a call (closed), text that is no call, or a call the text ends inside
CALL, NOT_CALL, UNFINISHED = "call", "not a call", "unfinished"
Outcome = tuple[str, ToolCall | None, int]  # (what, the call, where the call ends)


class TaggedCalls(Format):
    """A format whose calls are tagged blocks in the reply's text, after an optional thinking block: the
    reasoning, the content around the calls (the blank space next to a call is the template's, not the
    content's) and the calls, each a call once it is closed. A block that turns out to be no call stays
    content; one the reply ends inside is dropped, and `broken` says so."""

    # a call ends the reasoning where the model did not close it first (Qwen3.5 does so; llama.cpp reads it so)
    reasoning_ends_at_call: ClassVar[bool] = False

    @abstractmethod
    def _read_call(self, text: str, at: int, ctx: ReplyContext, final: bool) -> Outcome:
        """The call that may start at `at` (where _next_start found it)."""

    def _next_start(self, text: str, at: int) -> int:
        """Where the next call may start, from `at`; -1 where none can."""
        return text.find(OPEN, at)

    def parse(self, text: str, ctx: ReplyContext, final: bool = True) -> Reply:
        found = self._reasoning(text, ctx, final)
        if found is None:
            return Reply()  # maybe the thinking block's opener, half-written
        reasoning, pos = found
        calls: list[ToolCall] = []
        content: list[str] = []
        broken = ""
        segment = scan = skip_space(text, pos)
        while (start := self._next_start(text, scan)) >= 0:
            what, call, end = self._read_call(text, start, ctx, final)
            if what == NOT_CALL:
                if text.startswith(OPEN, start):
                    broken = broken or f"a {OPEN} block that is not a call: {text[start:start + 80]!r}"
                scan = start + 1
                continue
            content.append(text[segment:start].rstrip())
            if what == UNFINISHED:  # not content yet, nor a call; at the end, a call cut short (max_tokens?)
                if final:
                    broken = broken or f"the reply ended inside a call: {text[start:start + 80]!r}"
                segment = len(text)
                break
            assert call is not None
            calls.append(call)
            segment = scan = skip_space(text, end)
        content.append(text[segment:])
        out = "".join(content)
        return Reply(out if out.strip() else "", reasoning, tuple(calls), broken)

    def _reasoning(self, text: str, ctx: ReplyContext, final: bool) -> tuple[str, int] | None:
        """(the reasoning, where what follows it starts); None while the reply may be opening its block."""
        if not ctx.reasoning or not self.think_open:
            return "", 0
        body = 0
        if not self.starts_in_reasoning(ctx):
            lead = skip_space(text, 0)
            if not text.startswith(self.think_open, lead):
                if not final and lead < len(text) and self.think_open.startswith(text[lead:]):
                    return None
                return "", 0
            body = lead + len(self.think_open)
        scan = body
        while True:
            close = text.find(self.think_close, scan)
            start = self._next_start(text, scan) if self.reasoning_ends_at_call else -1
            if start >= 0 and (close < 0 or start < close):
                if self._read_call(text, start, ctx, final)[0] != NOT_CALL:
                    return text[body:start].strip(), start
                scan = start + 1
                continue
            if close >= 0:
                return text[body:close].strip(), close + len(self.think_close)
            return text[body:].strip(), len(text)


class QwenXml(TaggedCalls):
    name = "qwen3-xml"
    markers = (OPEN, CLOSE, FUNCTION, FUNCTION_END, PARAMETER, PARAMETER_END, "<think>", "</think>")
    call_start = OPEN
    reasoning_ends_at_call = True

    bare_function: ClassVar[bool] = False  # a call may open with <function=NAME>, leaving out <tool_call>

    @classmethod
    def for_template(cls, source: str) -> "QwenXml | None":
        # Qwen3's Hermes template and GLM's also write <tool_call>; only this family writes <function=…> inside
        # it with <parameter=…> values (functionary's <function=…> has no <parameter=)
        if OPEN not in source or FUNCTION not in source or PARAMETER not in source:
            return None
        return cls() if "<think>" in source else QwenCoderXml()

    def call_grammar(self, tools: list[dict[str, Any]], parallel: bool) -> str:
        """The template's call: `<tool_call>\\n<function=NAME>\\n`, each parameter `<parameter=P>\\nVALUE\\n
        </parameter>\\n` (required ones always, optional ones may be left out, in the schema's order), then
        `</function>\\n</tool_call>`; calls separated by a newline, as the template joins them. A string value
        is any text the parser reads back whole (VALUE_TEXT), another value the JSON its schema allows."""
        rules = [text_without("text", VALUE_TEXT, before="\n")]
        functions = []
        for i, (name, params) in enumerate(tool_parts(tools)):
            check_name(name, "<>\n", "tool name")
            parts = []
            for j, (key, schema, required) in enumerate(parameters(params)):
                check_name(key, "<>\n", f"{name}'s parameter name")
                value_rules, value = text_value(schema, params, f"f{i}-v{j}", "text", python_words=True)
                rules.append(value_rules)
                arg = f"{literal(PARAMETER + key + '>' + chr(10))} {value} {literal(chr(10) + PARAMETER_END + chr(10))}"
                parts.append(arg if required else f"({arg})?")
            rules.append(f"f{i} ::= {literal(FUNCTION + name + '>' + chr(10))} {' '.join(parts)}".rstrip())
            functions.append(f"f{i}")
        rules.append(f"body ::= ({' | '.join(functions)}) {literal(FUNCTION_END + chr(10) + CLOSE)}")
        rules.append(f"call ::= {literal(OPEN + chr(10))} body")
        # Qwen3-Coder may leave out the first call's opener (llama.cpp's grammar allows it). Its lazy grammar
        # still triggers on <tool_call> alone: llama.cpp also triggers on `<function=NAME>` of each offered tool,
        # which triggers() cannot name without the tools, and a bare `<function=` would feed the grammar the
        # token that completes it, which in Qwen's BPE carries the name's start (`=search`): one naming no offered
        # tool makes llama.cpp throw from inside the sampler
        first = f"{literal(OPEN + chr(10))}? body" if self.bare_function else "call"
        rules.append(f"root ::= {first}" + (' ("\\n" call)*' if parallel else ""))
        return "\n".join(r for r in rules if r) + "\n"

    def _next_start(self, text: str, at: int) -> int:
        start = text.find(OPEN, at)
        bare = text.find(FUNCTION, at) if self.bare_function else -1
        return bare if bare >= 0 and (start < 0 or bare < start) else start

    def _read_call(self, text: str, at: int, ctx: ReplyContext, final: bool) -> Outcome:
        bare = not text.startswith(OPEN, at)
        pos = at if bare else skip_space(text, at + len(OPEN))
        head = expect(text, pos, FUNCTION)
        if head is not True:
            return (NOT_CALL if head is False else UNFINISHED), None, at
        name_at = pos + len(FUNCTION)
        name_end = text.find(">", name_at)
        name = text[name_at:name_end] if name_end >= 0 else text[name_at:]
        if "\n" in name or "<" in name or (name_end >= 0 and not name.strip()):
            return NOT_CALL, None, at
        if name_end < 0:
            # a bare <function= is a call only once its name is whole and offered; at the end it is text
            return (NOT_CALL if bare and final else UNFINISHED), None, at
        name = name.strip()
        if bare and ctx.tools and ctx.schema(name) is None:
            return NOT_CALL, None, at
        args: dict[str, object] = {}
        pos = name_end + 1
        while True:
            pos = skip_space(text, pos)
            if text.startswith(PARAMETER, pos):
                key_at = pos + len(PARAMETER)
                key_end = text.find(">", key_at)
                key = text[key_at:key_end] if key_end >= 0 else text[key_at:]
                if "\n" in key or (key_end >= 0 and not key.strip()):
                    return NOT_CALL, None, at
                end = _VALUE_END.search(text, key_end + 1) if key_end >= 0 else None
                if end is None:
                    return UNFINISHED, None, at
                value = _unwrap(text[key_end + 1:end.start()])
                args[key.strip()] = cast_value(value, ctx.param_schema(name, key.strip()))
                pos = end.end()
                continue
            if text.startswith(FUNCTION_END, pos):
                close = skip_space(text, pos + len(FUNCTION_END))
                tail = expect(text, close, CLOSE)
                if tail is None:
                    return UNFINISHED, None, at
                if tail is False:
                    return NOT_CALL, None, at
                return CALL, ToolCall(name, dumps(args), new_call_id()), close + len(CLOSE)
            if pos == len(text) or any(m.startswith(text[pos:]) for m in (PARAMETER, FUNCTION_END)):
                return UNFINISHED, None, at
            return NOT_CALL, None, at


# Where a value ends: its </parameter> where the next parameter or the call's end follows (so the tags may be
# a value's text), else (the model left it unclosed) the next parameter on a line of its own, or the call's end.
_VALUE_END = re.compile(
    r"</parameter>\s*(?=<parameter=[^>\n]*>|</function>\s*</tool_call>)"
    r"|(?=\n<parameter=[^>\n]*>)"
    r"|(?=</function>\s*</tool_call>)")


def _unwrap(value: str) -> str:
    """A value less the newline the template writes on each side of it."""
    if value.startswith("\n"):
        value = value[1:]
    return value[:-1] if value.endswith("\n") else value


def expect(text: str, at: int, literal: str) -> bool | None:
    """Whether `literal` is at `at`: True, False, or None where the text ends on the start of it."""
    if text.startswith(literal, at):
        return True
    return None if literal.startswith(text[at:]) else False


def skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


class QwenCoderXml(QwenXml):
    """Qwen3-Coder's: its template has no thinking block, so its replies are content and calls alone; and it
    sometimes leaves out the <tool_call> opener, so a `<function=NAME>` of an offered tool opens a call."""

    think_open = think_close = ""
    bare_function = True


# Grammar: the pieces of a call whose values are text (Qwen's XML, GLM's pairs)

# what ends a Qwen value as the parser reads it (_VALUE_END), a value's own text must not hold: a
# </parameter> before the next parameter or the call's end, a parameter on a line of its own, the call's end.
# `\n<parameter=` stands for `\n<parameter=NAME>` (the grammar refuses a little more than the parser reads)
VALUE_TEXT: tuple[Closer, ...] = (
    (PARAMETER_END, SPACES, PARAMETER),
    ("\n" + PARAMETER,),
    (FUNCTION_END, SPACES, CLOSE),
)
# the keywords that say nothing of a value's type: a schema of these alone takes any text, as cast_value reads it
_ANNOTATIONS = frozenset({"description", "title", "default", "examples", "$comment", "deprecated", "readOnly",
                          "writeOnly"})


def parameters(params: dict[str, Any]) -> list[tuple[str, dict[str, Any], bool]]:
    """(name, schema, required) of each parameter the tool's schema describes, in its order."""
    props = params.get("properties")
    if not isinstance(props, dict):
        return []
    required = params.get("required")
    needed = {r for r in required if isinstance(r, str)} if isinstance(required, list) else set()
    return [(str(k), v if isinstance(v, dict) else {}, k in needed) for k, v in props.items()]


def text_value(schema: dict[str, Any], params: dict[str, Any], prefix: str, text: str,
               python_words: bool = False) -> tuple[str, str]:
    """(rules, expression) for a value written as text, typed as cast_value reads it back: a string is the
    raw text (`text`: the rule for any text the format can read back whole), one of its enum's where it has
    one; a union with string, or a schema that names no type, any text (cast_value reads JSON where the text is
    JSON, as llama.cpp's grammar allows); anything else the JSON its schema allows (its $defs from the tool's).
    python_words: a boolean or null may also be written True, False, None (Qwen's templates render a value
    with Jinja's `string`, so the models write them so; cast_value reads them)."""
    types = _types(schema)
    if types == {"string"}:
        choices = schema["enum"] if isinstance(schema.get("enum"), list) else []
        if not choices and "const" in schema:
            choices = [schema["const"]]
        if choices:
            return "", "(" + " | ".join(literal(str(v)) for v in choices) + ")"
        return "", text
    if "string" in types or not set(schema) - _ANNOTATIONS:
        return "", text
    doc = dict(schema)
    for key in ("$defs", "definitions"):
        if key in params and key not in doc:
            doc[key] = params[key]
    rules, root = schema_rules(doc, prefix)  # its strings as strict as cast_value's json.loads
    words = ['"True"', '"False"'] if "boolean" in types else []
    words += ['"None"'] if "null" in types else []
    if python_words and words and "enum" not in schema and "const" not in schema:
        return rules, f"({root} | {' | '.join(words)})"
    return rules, root


def check_name(name: str, refused: str, what: str) -> None:
    """A name the format could not write so that its parser reads it back is the client's error."""
    if not name or name != name.strip() or any(c in refused for c in name):
        raise UserError(f"the {what} {name!r} cannot be written in this model's tool call format", field="tools")

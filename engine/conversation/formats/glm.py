"""GLM's tool calls (GLM-4.5, 4.6, 4.7, 5.x; also Spark 2.5 and Laguna, whose templates write the same): one
block a call, the function's name and then key/value pairs, after the `<think>…</think>` block. GLM-4.5 and
4.6 put a newline after the name and each pair; 4.7 and 5.x write it all on one line:

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

    <tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>

From the templates' own rendering of an assistant's calls (models/templates/GLM-4.6.jinja,
GLM-4.7-Flash.jinja in the pinned llama.cpp), read as llama.cpp (its tagged-arguments parser) and vLLM's
glm45/glm47 tool parsers read it. A value is the text between its tags, verbatim (a string is written raw, any
other value as JSON), and is cast to the parameter's schema type: `3` is 3 for an integer, "3" for a string.
A value ends at `</arg_value>`; one the model left unclosed ends where the next `<arg_key>…</arg_key>
<arg_value>` begins, or at a `</tool_call>` that ends the reply or is followed by the next call.

GLM-4.5/4.6 open the thinking block themselves (`<think>` at the reply's start); GLM-4.7 and 5.x's template
opens it in the prompt (`<|assistant|><think>`), so their replies start in reasoning, which runs to `</think>`
(llama.cpp's reading: a `<tool_call>` inside it is the model's thinking)."""

import re
from typing import Any

from swarmtune.engine.conversation.formats.base import cast_value, dumps
from swarmtune.engine.conversation.formats.grammar import BLANK, SPACES, Closer, literal, text_without, tool_parts
from swarmtune.engine.conversation.formats.qwen_xml import (
    CALL,
    CLOSE,
    NOT_CALL,
    OPEN,
    UNFINISHED,
    Outcome,
    TaggedCalls,
    check_name,
    expect,
    parameters,
    skip_space,
    text_value,
)
from swarmtune.engine.conversation.formats.reply import ReplyContext, ToolCall, new_call_id

KEY, KEY_END = "<arg_key>", "</arg_key>"
VALUE, VALUE_END = "<arg_value>", "</arg_value>"


class Glm(TaggedCalls):
    name = "glm"
    markers = (OPEN, CLOSE, KEY, KEY_END, VALUE, VALUE_END, "<think>", "</think>")
    call_start = OPEN

    @classmethod
    def for_template(cls, source: str) -> "Glm | None":
        # Qwen's templates (Hermes, XML) also write <tool_call>; only this family writes <arg_key> pairs in it
        if OPEN not in source or KEY not in source:
            return None
        return Ling3() if "<role>ASSISTANT</role>" in source else cls()

    def call_grammar(self, tools: list[dict[str, Any]], parallel: bool) -> str:
        """The templates' call: `<tool_call>NAME`, each parameter `<arg_key>P</arg_key><arg_value>VALUE
        </arg_value>` (required ones always, optional ones may be left out, in the schema's order), then
        `</tool_call>`; with or without a newline after the name, each tag pair and each call (GLM-4.5/4.6,
        Ling 3 and Laguna write them, 4.7/5.x do not). A string value is any text the parser reads back whole
        (VALUE_TEXT), verbatim; another value the JSON its schema allows."""
        rules = [text_without("text", VALUE_TEXT), 'nl ::= "\\n"?']
        functions = []
        for i, (name, params) in enumerate(tool_parts(tools)):
            check_name(name, "<" + BLANK, "tool name")
            parts = []
            for j, (key, schema, required) in enumerate(parameters(params)):
                check_name(key, "<", f"{name}'s parameter name")
                value_rules, value = text_value(schema, params, f"f{i}-v{j}", "text")
                rules.append(value_rules)
                arg = f"nl {literal(KEY + key + KEY_END)} nl {literal(VALUE)} {value} {literal(VALUE_END)}"
                parts.append(arg if required else f"({arg})?")
            rules.append(f"f{i} ::= {literal(name)} {' '.join(parts)}".rstrip())
            functions.append(f"f{i}")
        rules.append(f"call ::= {literal(OPEN)} ({' | '.join(functions)}) nl {literal(CLOSE)}")
        rules.append("root ::= call" + (" (nl call)*" if parallel else ""))
        return "\n".join(r for r in rules if r) + "\n"

    def _read_call(self, text: str, at: int, ctx: ReplyContext, final: bool) -> Outcome:
        name_at = skip_space(text, at + len(OPEN))
        name_end = _NAME_END.search(text, name_at)
        if name_end is None:
            return UNFINISHED, None, at
        name = text[name_at:name_end.start()].strip()
        if not name or any(c.isspace() for c in name):
            return NOT_CALL, None, at
        args: dict[str, object] = {}
        pos = name_end.start()
        while True:
            pos = skip_space(text, pos)
            if text.startswith(KEY, pos):
                key_end = text.find(KEY_END, pos + len(KEY))
                if key_end < 0:
                    return UNFINISHED, None, at
                key = text[pos + len(KEY):key_end].strip()
                if not key or "<" in key:
                    return NOT_CALL, None, at
                value_at = skip_space(text, key_end + len(KEY_END))
                opened = expect(text, value_at, VALUE)
                if opened is not True:
                    return (NOT_CALL if opened is False else UNFINISHED), None, at
                value_at += len(VALUE)
                # a </tool_call> with nothing after it ends an unclosed value only once the reply has ended
                end = (_VALUE_END_FINAL if final else _VALUE_END).search(text, value_at)
                if end is None:
                    return UNFINISHED, None, at
                args[key] = cast_value(text[value_at:end.start()], ctx.param_schema(name, key))
                pos = end.end()
                continue
            closed = expect(text, pos, CLOSE)
            if closed is True:
                return CALL, ToolCall(name, dumps(args), new_call_id()), pos + len(CLOSE)
            if closed is None or KEY.startswith(text[pos:]):
                return UNFINISHED, None, at
            return NOT_CALL, None, at


# the name runs to the first pair, the call's end or a newline
_NAME_END = re.compile(r"[\n<]")
# Where a value ends: its </arg_value>; or, left unclosed, where the next pair begins or the call ends (a
# </tool_call> followed by the next call, or by the reply's end)
_UNCLOSED = r"|(?=\s*<arg_key>[^<]*</arg_key>\s*<arg_value>)|(?=</tool_call>\s*<tool_call>)"
_VALUE_END = re.compile(r"</arg_value>" + _UNCLOSED)
_VALUE_END_FINAL = re.compile(r"</arg_value>" + _UNCLOSED + r"|(?=</tool_call>\s*\Z)")
# what ends a value as the parser reads it (_VALUE_END), a value's own text must not hold: its closer, the next
# pair (`</arg_key>` then `<arg_value>` stands for the whole `<arg_key>…</arg_key><arg_value>`), the next call
VALUE_TEXT: tuple[Closer, ...] = ((VALUE_END,), (KEY_END, SPACES, VALUE), (CLOSE, SPACES, OPEN))



class Ling3(Glm):
    """Ling 3.0 (Bailing V3) writes GLM's calls, but its prompt opens the thinking block and a call may come
    before the model closes it: the call ends the reasoning there (llama.cpp's common/parsers/ling3.cpp)."""

    reasoning_ends_at_call = True

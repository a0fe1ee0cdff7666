"""GLM's tool calls (engine/conversation/formats/glm.py): GLM-4.5/4.6 (newlines) and GLM-4.7/5.x (compact).

The parse cases are llama.cpp's own, ported from tests/test-chat.cpp (the peg_testers of
models/templates/GLM-4.6.jinja, models/templates/GLM-4.7-Flash.jinja and models/templates/Spark2.5.jinja,
which writes GLM-4.7's calls, in the llama.cpp that swarmtune pins): the reply, the tools offered, and the
content, reasoning_content and tool_calls llama.cpp expects of it. Left out: the continuation cases, which
parse the prefilled assistant message together with the reply. The rest are this format's own rules: typed
values, what ends a value, a call cut short, what a stream must hold back."""

import json
from typing import Any

import pytest

from swarmtune.engine.conversation.formats.glm import Glm, Ling3
from swarmtune.engine.conversation.formats.reply import Reply, ReplyContext
from swarmtune.engine.conversation.formats.stream import ReplyStream
from tests.llama_templates import template

GLM45 = "<|assistant|>"  # GLM-4.5/4.6's generation prompt: the model opens <think> itself
GLM45_NO_THINKING = "<|assistant|>\n<think></think>"
GLM47 = "<|assistant|><think>"  # GLM-4.7's, thinking on: the reply starts in reasoning
GLM47_NO_THINKING = "<|assistant|></think>"
SPARK_NO_THINKING = "<｜start▁of▁sentence｜><|Bot|></think>"
ASSIST = "Hello, world!\nWhat's up?"


def tool(tool_name: str, /, **props: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": tool_name, "parameters": {"type": "object", "properties": props}}}


STRING, INTEGER = {"type": "string"}, {"type": "integer"}
SPECIAL = tool("special_function", arg1=INTEGER)
SPECIAL_OPT = tool("special_function_with_opt", arg1=INTEGER, arg2=INTEGER)
SPECIAL_CALL = ("special_function", {"arg1": 1})
TWO = [SPECIAL_CALL, ("special_function_with_opt", {"arg1": 1, "arg2": 2})]
COMPACT = "<tool_call>special_function<arg_key>arg1</arg_key><arg_value>1</arg_value></tool_call>"
TWO_COMPACT = (COMPACT + "<tool_call>special_function_with_opt<arg_key>arg1</arg_key><arg_value>1</arg_value>"
               "<arg_key>arg2</arg_key><arg_value>2</arg_value></tool_call>")
SPARK_TOOLS = (tool("magic_int", ref=INTEGER, name=STRING), tool("amount", orig={"type": "number"}),
               tool("toggle", enabled={"type": "boolean"}), tool("set_config", config={"type": "object"}),
               tool("nested_args", tags={"type": "array"}, entries={"type": "array"}), tool("empty_args"))


def calls(r: Reply) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, json.loads(c.arguments)) for c in r.calls]


def ctx(prompt_tail: str, *tools: dict[str, Any]) -> ReplyContext:
    return ReplyContext(prompt_tail=prompt_tail, tools=tools)


# (template, reply, prompt tail, tools, content, reasoning, calls): tests/test-chat.cpp's GLM-4.6, GLM-4.7-Flash
# and Spark2.5 peg_testers
LLAMA_CPP = [
    ("GLM-4.6.jinja", "<tool_call>special_function\n<arg_key>arg1</arg_key>\n<arg_value>1</arg_value>\n</tool_call>",
     GLM45, (SPECIAL,), "", "", [SPECIAL_CALL]),
    ("GLM-4.7-Flash.jinja", ASSIST, GLM47_NO_THINKING, (), ASSIST, "", []),
    ("GLM-4.7-Flash.jinja", "I'm\nthinking</think>Hello, world!\nWhat's up?", GLM47, (), ASSIST, "I'm\nthinking", []),
    ("GLM-4.7-Flash.jinja", COMPACT, GLM47_NO_THINKING, (SPECIAL,), "", "", [SPECIAL_CALL]),
    ("GLM-4.7-Flash.jinja", "I'm\nthinking</think>" + COMPACT, GLM47, (SPECIAL,), "", "I'm\nthinking",
     [SPECIAL_CALL]),
    ("GLM-4.7-Flash.jinja", TWO_COMPACT, GLM47_NO_THINKING, (SPECIAL, SPECIAL_OPT), "", "", TWO),
    # #20650: a tool with no required arguments, called with no pairs at all
    ("GLM-4.7-Flash.jinja", "Let me read the diff content.</think><tool_call>read_file_diff_md</tool_call>", GLM47,
     (tool("read_file_diff_md", review_id=STRING, file_id=STRING),), "", "Let me read the diff content.",
     [("read_file_diff_md", {})]),
    ("Spark2.5.jinja", ASSIST, SPARK_NO_THINKING, (), ASSIST, "", []),
    ("Spark2.5.jinja", "I'm\nthinking</think>" + COMPACT, "<|Bot|><think>", (SPECIAL,), "", "I'm\nthinking",
     [SPECIAL_CALL]),
    ("Spark2.5.jinja", TWO_COMPACT, SPARK_NO_THINKING, (SPECIAL, SPECIAL_OPT), "", "", TWO),
    ("Spark2.5.jinja",
     "Preparing updates.<tool_call>magic_int<arg_key>ref</arg_key><arg_value>42</arg_value>"
     "<arg_key>name</arg_key><arg_value>上海</arg_value></tool_call>"
     "<tool_call>amount<arg_key>orig</arg_key><arg_value>2.5</arg_value></tool_call>"
     "<tool_call>toggle<arg_key>enabled</arg_key><arg_value>true</arg_value></tool_call>"
     "<tool_call>set_config<arg_key>config</arg_key>"
     "<arg_value>{\"source\": \"spark\", \"options\": {\"strict\": true}}</arg_value></tool_call>"
     "<tool_call>nested_args<arg_key>tags</arg_key><arg_value>[\"alpha\", \"测试\"]</arg_value>"
     "<arg_key>entries</arg_key><arg_value>[{\"id\": 1, \"label\": \"first\"}, {\"id\": 2, \"label\": \"第二\"}]"
     "</arg_value></tool_call>"
     "<tool_call>empty_args</tool_call>", SPARK_NO_THINKING, SPARK_TOOLS, "Preparing updates.", "",
     [("magic_int", {"ref": 42, "name": "上海"}), ("amount", {"orig": 2.5}), ("toggle", {"enabled": True}),
      ("set_config", {"config": {"source": "spark", "options": {"strict": True}}}),
      ("nested_args", {"tags": ["alpha", "测试"], "entries": [{"id": 1, "label": "first"},
                                                              {"id": 2, "label": "第二"}]}),
      ("empty_args", {})]),
]


def fmt_for(name: str) -> Glm:
    fmt = Glm.for_template(template(name))
    assert fmt is not None
    return fmt


@pytest.mark.parametrize(("name", "text", "tail", "tools", "content", "reasoning", "expected"), LLAMA_CPP)
def test_llama_cpp_cases(name: str, text: str, tail: str, tools: tuple[dict[str, Any], ...], content: str,
                         reasoning: str, expected: list[object]) -> None:
    r = fmt_for(name).parse(text, ctx(tail, *tools))
    assert (r.content, r.reasoning, calls(r)) == (content, reasoning, expected)
    assert not r.broken


def test_templates_pick_glm() -> None:
    for name in ("GLM-4.6.jinja", "GLM-4.7-Flash.jinja", "Spark2.5.jinja", "poolside-Laguna-XS.2.jinja"):
        assert type(fmt_for(name)) is Glm
    assert type(fmt_for("inclusionai-ling-3.0-flash.jinja")) is Ling3
    # Qwen's templates write <tool_call> too, but no <arg_key>
    for other in ("Qwen-Qwen3-0.6B.jinja", "Qwen3-Coder.jinja", "Qwen3.5-4B.jinja"):
        assert Glm.for_template(template(other)) is None


def test_registry_picks_glm() -> None:
    from swarmtune.engine.conversation.formats.registry import pick

    assert pick(template("GLM-4.6.jinja")).fmt.name == "glm"
    assert pick(template("GLM-4.7-Flash.jinja")).fmt.name == "glm"


def test_glm45_opens_its_own_thinking_block() -> None:
    text = ("\n<think>Need live data.</think>\nI'll look.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
            "<arg_value>Berlin</arg_value>\n</tool_call>")
    r = fmt_for("GLM-4.6.jinja").parse(text, ctx(GLM45, tool("get_weather", city=STRING)))
    assert (r.content, r.reasoning) == ("I'll look.", "Need live data.")
    assert calls(r) == [("get_weather", {"city": "Berlin"})]


def test_values_are_typed_by_the_schema_and_strings_stay_verbatim() -> None:
    text = ("<tool_call>f<arg_key>n</arg_key><arg_value>3</arg_value><arg_key>s</arg_key><arg_value>3</arg_value>"
            "<arg_key>j</arg_key><arg_value>{\"a\": 1}</arg_value>"
            "<arg_key>w</arg_key><arg_value>  two\n lines </arg_value></tool_call>")
    r = fmt_for("GLM-4.7-Flash.jinja").parse(text, ctx(GLM47_NO_THINKING, tool("f", n=INTEGER, s=STRING, j=STRING,
                                                                                w=STRING)))
    assert calls(r) == [("f", {"n": 3, "s": "3", "j": "{\"a\": 1}", "w": "  two\n lines "})]


def test_markers_inside_a_value_are_its_text() -> None:
    value = "Wrap each call in <tool_call> and </tool_call>; keys go in <arg_key>."
    text = f"<tool_call>write<arg_key>content</arg_key><arg_value>{value}</arg_value></tool_call>"
    r = fmt_for("GLM-4.7-Flash.jinja").parse(text, ctx(GLM47_NO_THINKING, tool("write", content=STRING)))
    assert calls(r) == [("write", {"content": value})]


def test_an_unclosed_value_ends_where_the_next_pair_or_the_call_ends() -> None:
    weather = tool("get_weather", city=STRING, unit=STRING)
    glm = fmt_for("GLM-4.7-Flash.jinja")
    last = ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Berlin</arg_value>"
            "<arg_key>unit</arg_key><arg_value>celsius</tool_call>")
    assert calls(glm.parse(last, ctx(GLM47_NO_THINKING, weather))) == [
        ("get_weather", {"city": "Berlin", "unit": "celsius"})]
    first = ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Berlin"
             "<arg_key>unit</arg_key><arg_value>celsius</arg_value></tool_call>")
    assert calls(glm.parse(first, ctx(GLM47_NO_THINKING, weather))) == [
        ("get_weather", {"city": "Berlin", "unit": "celsius"})]
    # while the reply may go on, a </tool_call> could still be a value's text
    assert glm.parse(last, ctx(GLM47_NO_THINKING, weather), final=False).calls == ()


def test_a_call_cut_short_is_dropped_and_said() -> None:
    glm = fmt_for("GLM-4.7-Flash.jinja")
    full = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Berlin</arg_value></tool_call>"
    for n in range(len("<tool_call>"), len(full)):
        r = glm.parse("Checking." + full[:n], ctx(GLM47_NO_THINKING, tool("get_weather", city=STRING)))
        assert (r.content, r.calls) == ("Checking.", ()), full[:n]
        assert r.broken


def test_a_tool_call_inside_unclosed_reasoning_is_reasoning() -> None:
    """llama.cpp reads GLM's thinking to </think>; Ling 3.0's ends at a call (its own parser)."""
    text = "Let me look.<tool_call>get_time</tool_call>"
    r = fmt_for("GLM-4.7-Flash.jinja").parse(text, ctx(GLM47, tool("get_time")))
    assert (r.reasoning, r.calls) == (text, ())
    r = fmt_for("inclusionai-ling-3.0-flash.jinja").parse(text, ctx("<role>ASSISTANT</role>\n<think>",
                                                                      tool("get_time")))
    assert (r.reasoning, calls(r)) == ("Let me look.", [("get_time", {})])


STREAMED = [
    ("GLM-4.6.jinja", ctx(GLM45, SPECIAL),
     "\n<think>Think.</think>\nI'll call.\n<tool_call>special_function\n<arg_key>arg1</arg_key>\n"
     "<arg_value>1</arg_value>\n</tool_call>\n<tool_call>special_function\n</tool_call>after"),
    ("GLM-4.7-Flash.jinja", ctx(GLM47, SPECIAL, SPECIAL_OPT), "I'm\nthinking</think>Checking." + TWO_COMPACT),
    ("GLM-4.7-Flash.jinja", ctx(GLM47_NO_THINKING, tool("write", content=STRING)),
     "<tool_call>write<arg_key>content</arg_key><arg_value>a </tool_call> b <arg_key> c</arg_value></tool_call>"),
    ("GLM-4.7-Flash.jinja", ctx(GLM47_NO_THINKING, tool("get_weather", city=STRING, unit=STRING)),
     "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Berlin</arg_value><arg_key>unit</arg_key>"
     "<arg_value>celsius</tool_call>"),
    ("GLM-4.7-Flash.jinja", ctx(GLM47_NO_THINKING, SPECIAL), "Sure." + COMPACT[:50]),
]


@pytest.mark.parametrize(("name", "context", "text"), STREAMED)
def test_streamed_one_character_at_a_time_equals_the_whole(name: str, context: ReplyContext, text: str) -> None:
    fmt = fmt_for(name)
    whole = fmt.parse(text, context)
    stream = ReplyStream(fmt, context)
    for ch in text:
        stream.feed(ch)
    stream.finish()
    got = stream.result()
    assert (got.content, got.reasoning, calls(got), got.broken) == (whole.content, whole.reasoning, calls(whole),
                                                                   whole.broken)

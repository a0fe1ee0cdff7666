"""DeepSeek's formats (engine/conversation/formats/deepseek.py, deepseek_dsml.py).

The parse cases are llama.cpp's own, ported from tests/test-chat.cpp (the llama.cpp that swarmtune pins): the
peg_tester blocks of models/templates/deepseek-ai-DeepSeek-V3.1.jinja, -V3.2.jinja, -V4.jinja,
-V4-Flash-0731.jinja, deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja, -R1-Distill-Qwen-32B.jinja and
llama-cpp-deepseek-r1.jinja: the reply, the generation prompt the template ends with (thinking on or off),
and the content, reasoning_content and tool_calls llama.cpp expects. Left out: the continuation cases, which
parse a prefilled assistant message together with the reply. The rest are this format's own rules: which
template gives which variant, V4.1's spaced DSML, a call cut short or malformed, what a stream holds back."""

import json

import pytest

from swarmtune.engine.conversation.formats.deepseek import DeepSeek, Variant
from swarmtune.engine.conversation.formats.registry import pick
from swarmtune.engine.conversation.formats.reply import Reply, ReplyContext
from swarmtune.engine.conversation.formats.stream import ReplyStream
from tests.llama_templates import template

ASSIST = "Hello, world!\nWhat's up?"
THOUGHTS = "I'm\nthinking"


def tool(fn: str, /, **props: str) -> dict[str, object]:
    return {"type": "function", "function": {"name": fn, "parameters": {
        "type": "object", "properties": {k: {"type": t} for k, t in props.items()}}}}


TOOLS = (tool("get_time", city="string"), tool("get_weather", city="string"), tool("special_function", arg1="integer"),
         tool("magic_int", ref="integer", name="string"), tool("amount", orig="number"),
         tool("toggle", enabled="boolean"), tool("todo_list", todos="array"), tool("set_config", config="object"))


def ctx(prompt_tail: str) -> ReplyContext:
    return ReplyContext(prompt_tail=prompt_tail, tools=TOOLS)


def calls(r: Reply) -> list[tuple[str, object]]:
    return [(c.name, json.loads(c.arguments)) for c in r.calls]


def v31(*calls_: tuple[str, str]) -> str:
    return ("<｜tool▁calls▁begin｜>" + "".join(f"<｜tool▁call▁begin｜>{n}<｜tool▁sep｜>{a}<｜tool▁call▁end｜>"
                                              for n, a in calls_) + "<｜tool▁calls▁end｜>")


def dsml(block: str, *invokes: tuple[str, list[tuple[str, str, str]]], sp: str = "") -> str:
    t = "｜DSML｜" + sp
    body = "".join(f'<{t}invoke name="{n}">\n' + "".join(
        f'<{t}parameter name="{k}" string="{s}">{v}</{t}parameter>\n' for k, s, v in params) + f"</{t}invoke>\n"
        for n, params in invokes)
    return f"<{t}{block}>\n{body}</{t}{block}>"


def fc(*invokes: tuple[str, list[tuple[str, str, str]]]) -> str:
    return dsml("function_calls", *invokes)


def tc(*invokes: tuple[str, list[tuple[str, str, str]]]) -> str:
    return dsml("tool_calls", *invokes)


V3_CALL = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>special_function\n"
           "```json\n{\"arg1\": 1}```<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
TOKYO = ("get_time", [("city", "true", "Tokyo")])
ARG1 = ("special_function", [("arg1", "false", "1")])

# the generation prompts the templates end with, thinking on and off
V31_ON, V31_OFF = "<｜Assistant｜><think>", "<｜Assistant｜><think></think>"
V32_ON, V32_OFF = "<｜Assistant｜><think>", "<｜Assistant｜><think></think>"
V4_ON, V4_OFF = "<｜Assistant｜><think>", "<｜Assistant｜></think>"
R1_OPEN = "<｜Assistant｜><think>\n"  # llama-cpp-deepseek-r1 and the R1 distills, thinking on
R1_QWEN_OFF = "<｜Assistant｜><think>\n</think>"

# (template, prompt tail, reply, content, reasoning, calls): tests/test-chat.cpp
LLAMA_CPP = [
    ("deepseek-ai-DeepSeek-V3.1.jinja", V31_OFF, v31(("get_time", '{"city": "XYZCITY"}')), "", "",
     [("get_time", {"city": "XYZCITY"})]),
    ("deepseek-ai-DeepSeek-V3.1.jinja", V31_ON, "REASONING</think>" + v31(("get_time", '{"city": "Tokyo"}')), "",
     "REASONING", [("get_time", {"city": "Tokyo"})]),
    ("deepseek-ai-DeepSeek-V3.1.jinja", V31_ON,
     "REASONING</think>CONTENT" + v31(("get_time", '{"city": "Paris"}'), ("get_weather", '{"city": "Paris"}')),
     "CONTENT", "REASONING", [("get_time", {"city": "Paris"}), ("get_weather", {"city": "Paris"})]),
    # llama.cpp expects the reasoning "REASONING\n" here; the format strips the thinking block's edges
    ("deepseek-ai-DeepSeek-V3.1.jinja", V31_ON, "REASONING</think>\nCONTENT", "CONTENT", "REASONING", []),
    ("deepseek-ai-DeepSeek-V3.1.jinja", V31_OFF, "CONTENT", "CONTENT", "", []),
    # V3.2
    ("deepseek-ai-DeepSeek-V3.2.jinja", V32_OFF, ASSIST, ASSIST, "", []),
    ("deepseek-ai-DeepSeek-V3.2.jinja", V32_ON, THOUGHTS + "</think>" + ASSIST, ASSIST, THOUGHTS, []),
    ("deepseek-ai-DeepSeek-V3.2.jinja", V32_ON, "Let me check the time</think>\n\n" + fc(TOKYO), "",
     "Let me check the time", [("get_time", {"city": "Tokyo"})]),
    ("deepseek-ai-DeepSeek-V3.2.jinja", V32_OFF, fc(ARG1), "", "", [("special_function", {"arg1": 1})]),
    ("deepseek-ai-DeepSeek-V3.2.jinja", V32_ON,
     "Calling both</think>\n\n" + fc(("get_time", [("city", "true", "Paris")]),
                                     ("get_weather", [("city", "true", "Paris")])),
     "", "Calling both", [("get_time", {"city": "Paris"}), ("get_weather", {"city": "Paris"})]),
    ("deepseek-ai-DeepSeek-V3.2.jinja", V32_ON, "Thinking about it</think>Let me call the function.\n\n" + fc(ARG1),
     "Let me call the function.", "Thinking about it", [("special_function", {"arg1": 1})]),
    ("deepseek-ai-DeepSeek-V3.2.jinja", V32_ON,
     "Test negative</think>\n\n" + fc(("magic_int", [("ref", "false", "-14")])), "", "Test negative",
     [("magic_int", {"ref": -14})]),
    ("deepseek-ai-DeepSeek-V3.2.jinja", V32_ON,
     "Test decimal</think>\n\n" + fc(("amount", [("orig", "false", "3.14")])), "", "Test decimal",
     [("amount", {"orig": 3.14})]),
    ("deepseek-ai-DeepSeek-V3.2.jinja", V32_ON,
     "Test boolean</think>\n\n" + fc(("toggle", [("enabled", "false", "true")])), "", "Test boolean",
     [("toggle", {"enabled": True})]),
    ("deepseek-ai-DeepSeek-V3.2.jinja", V32_ON,
     "Test array</think>\n\n" + fc(("todo_list", [("todos", "false", '["buy milk","walk dog"]')])), "",
     "Test array", [("todo_list", {"todos": ["buy milk", "walk dog"]})]),
    ("deepseek-ai-DeepSeek-V3.2.jinja", V32_ON,
     "Test object</think>\n\n" + fc(("set_config", [("config", "false", '{"theme":"dark","level":2}')])), "",
     "Test object", [("set_config", {"config": {"theme": "dark", "level": 2}})]),
    ("deepseek-ai-DeepSeek-V3.2.jinja", V32_ON, "</think>\n\n" + fc(("get_time", [("city", "true", "XYZCITY")])),
     "", "", [("get_time", {"city": "XYZCITY"})]),
    ("deepseek-ai-DeepSeek-V3.2.jinja", V32_ON,
     "Multi-arg call</think>\n\n" + fc(("magic_int", [("ref", "false", "42"), ("name", "true", "foo bar")])), "",
     "Multi-arg call", [("magic_int", {"ref": 42, "name": "foo bar"})]),
    # V4
    ("deepseek-ai-DeepSeek-V4.jinja", V4_OFF, ASSIST, ASSIST, "", []),
    ("deepseek-ai-DeepSeek-V4.jinja", V4_ON, THOUGHTS + "</think>" + ASSIST, ASSIST, THOUGHTS, []),
    ("deepseek-ai-DeepSeek-V4.jinja", V4_ON, "Let me check the time</think>\n\n" + tc(TOKYO), "",
     "Let me check the time", [("get_time", {"city": "Tokyo"})]),
    ("deepseek-ai-DeepSeek-V4.jinja", V4_OFF, tc(ARG1), "", "", [("special_function", {"arg1": 1})]),
    ("deepseek-ai-DeepSeek-V4.jinja", V4_ON,
     "Calling both</think>\n\n" + tc(("get_time", [("city", "true", "Paris")]),
                                     ("get_weather", [("city", "true", "Paris")])),
     "", "Calling both", [("get_time", {"city": "Paris"}), ("get_weather", {"city": "Paris"})]),
    ("deepseek-ai-DeepSeek-V4.jinja", V4_ON, "Thinking about it</think>Let me call the function.\n\n" + tc(ARG1),
     "Let me call the function.", "Thinking about it", [("special_function", {"arg1": 1})]),
    ("deepseek-ai-DeepSeek-V4.jinja", V4_ON,
     "Multi-arg call</think>\n\n" + tc(("magic_int", [("ref", "false", "42"), ("name", "true", "foo bar")])), "",
     "Multi-arg call", [("magic_int", {"ref": 42, "name": "foo bar"})]),
    # the calls block ends the thinking as </think> does
    ("deepseek-ai-DeepSeek-V4.jinja", V4_ON, "Let me check the time\n\n" + tc(TOKYO), "", "Let me check the time",
     [("get_time", {"city": "Tokyo"})]),
    # the DSML separator belongs to the block, not to the content
    ("deepseek-ai-DeepSeek-V4-Flash-0731.jinja", V4_OFF, "\n\n" + tc(ARG1), "", "",
     [("special_function", {"arg1": 1})]),
    # R1 and its distills: the prompt opens the thinking block
    ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", R1_OPEN, "</think>" + ASSIST, ASSIST, "", []),
    ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", R1_OPEN, THOUGHTS + "</think>" + ASSIST, ASSIST, THOUGHTS,
     []),
    ("llama-cpp-deepseek-r1.jinja", R1_OPEN, "</think>" + ASSIST, ASSIST, "", []),
    ("llama-cpp-deepseek-r1.jinja", R1_OPEN, THOUGHTS + "</think>" + ASSIST, ASSIST, THOUGHTS, []),
    ("llama-cpp-deepseek-r1.jinja", R1_OPEN, "</think>" + V3_CALL, "", "", [("special_function", {"arg1": 1})]),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", R1_OPEN, "</think>" + ASSIST, ASSIST, "", []),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", R1_OPEN, THOUGHTS + "</think>" + ASSIST, ASSIST, THOUGHTS,
     []),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", R1_QWEN_OFF, V3_CALL, "", "",
     [("special_function", {"arg1": 1})]),
]


@pytest.mark.parametrize(("name", "tail", "reply", "content", "reasoning", "expected"), LLAMA_CPP)
def test_llama_cpp_cases(name: str, tail: str, reply: str, content: str, reasoning: str,
                         expected: list[tuple[str, object]]) -> None:
    picked = pick(template(name))
    assert picked.known and isinstance(picked.fmt, DeepSeek)
    r = picked.fmt.parse(reply, ctx(tail))
    assert (r.content, r.reasoning, calls(r), r.broken) == (content, reasoning, expected, "")


@pytest.mark.parametrize(("name", "variant", "call_start"), [
    ("llama-cpp-deepseek-r1.jinja", "v3", "<｜tool▁calls▁begin｜>"),
    ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", "v3", "<｜tool▁calls▁begin｜>"),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "v3", "<｜tool▁calls▁begin｜>"),
    ("deepseek-ai-DeepSeek-V3.1.jinja", "v31", "<｜tool▁calls▁begin｜>"),
    ("deepseek-ai-DeepSeek-V3.2.jinja", "v32", "<｜DSML｜function_calls>"),
    ("deepseek-ai-DeepSeek-V4.jinja", "v4", "<｜DSML｜tool_calls>"),
    # the 0731 template writes V4's markup (llama.cpp's own test of it holds it to `tool_calls`)
    ("deepseek-ai-DeepSeek-V4-Flash-0731.jinja", "v4", "<｜DSML｜tool_calls>"),
])
def test_variant_from_template(name: str, variant: str, call_start: str) -> None:
    fmt = DeepSeek.for_template(template(name))
    assert fmt is not None and (fmt.variant, fmt.call_start, fmt.name) == (variant, call_start, "deepseek")


def test_spaced_dsml_template_is_v41() -> None:
    source = "{%- set dsml_token = '｜DSML｜' -%}{{ '<' + dsml_token + ' calls>' }}"
    fmt = DeepSeek.for_template(source)
    assert fmt is not None and (fmt.variant, fmt.call_start) == ("v41", "<｜DSML｜ calls>")


def test_other_templates_are_not_deepseek() -> None:
    for name in ("Qwen-Qwen3-0.6B.jinja", "Qwen3-Coder.jinja", "GLM-4.6.jinja", "Kimi-K2-Instruct.jinja",
                 "meta-llama-Llama-3.3-70B-Instruct.jinja", "openai-gpt-oss-120b.jinja"):
        assert DeepSeek.for_template(template(name)) is None


def test_v41_spaced_dsml() -> None:
    reply = "Plan.</think>Checking.\n\n" + dsml("calls", ("get_weather", [("city", "true", "杭州"),
                                                                         ("count", "false", "42")]), sp=" ")
    r = DeepSeek("v41").parse(reply, ReplyContext(prompt_tail=V4_ON))
    expected = [("get_weather", {"city": "杭州", "count": 42})]
    assert (r.content, r.reasoning, calls(r)) == ("Checking.", "Plan.", expected)


def test_dsml_values() -> None:
    """string="true" is the raw text (whitespace, quotes, markup-like text and all); a self-closing invoke
    has no arguments; a number mislabelled string="true" is cast where the schema rules a string out."""
    reply = tc(("magic_int", [("ref", "true", "7"), ("name", "true", '  a<b> "q"\n')]),
               ("echo", [("text", "true", 'Write <｜DSML｜invoke name="x"> to call')])) + ""
    reply = reply.replace("</｜DSML｜tool_calls>", '<｜DSML｜invoke name="submit"/>\n</｜DSML｜tool_calls>')
    r = DeepSeek("v4").parse(reply, ctx(V4_OFF))
    assert calls(r) == [("magic_int", {"ref": 7, "name": '  a<b> "q"\n'}),
                        ("echo", {"text": 'Write <｜DSML｜invoke name="x"> to call'}), ("submit", {})]


def test_v3_marker_text_inside_arguments() -> None:
    reply = ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>echo\n```json\n'
             '{"text": "a <｜tool▁call▁end｜> b"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>')
    r = DeepSeek("v3").parse(reply, ReplyContext())
    assert calls(r) == [("echo", {"text": "a <｜tool▁call▁end｜> b"})] and r.content == ""


@pytest.mark.parametrize(("variant", "reply"), [
    ("v3", '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{"a": 1'),
    ("v31", '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{"a": "x'),
    ("v4", '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="a" string="true">x'),
    ("v4", '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f'),
])
def test_cut_short_call_is_dropped(variant: Variant, reply: str) -> None:
    r = DeepSeek(variant).parse("Sure." + reply, ReplyContext())
    assert (r.content, r.calls) == ("Sure.", ()) and r.broken


def test_cut_in_second_call_keeps_first() -> None:
    reply = tc(TOKYO).replace("</｜DSML｜tool_calls>", '<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter')
    r = DeepSeek("v4").parse(reply, ctx(V4_OFF))
    assert calls(r) == [("get_time", {"city": "Tokyo"})] and r.content == "" and r.broken


def test_malformed_call_stays_content() -> None:
    reply = ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n'
             '{"city": "Tokyo"\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>')
    r = DeepSeek("v3").parse(reply, ReplyContext())
    assert (r.content, r.calls) == (reply, ()) and r.broken


STREAMED = [
    ("v3", "", 'Let me look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n'
     '{"city": "Zürich \\"x\\""}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n'
     '```json\n{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>'),
    ("v3", R1_OPEN, THOUGHTS + "</think>" + V3_CALL),
    ("v31", V31_ON, "REASONING</think>CONTENT" + v31(("get_time", '{"city": "<｜tool▁sep｜>"}'),
                                                    ("get_weather", '{"city": "Paris"}'))),
    ("v32", V32_ON, "Thinking about it</think>Let me call the function.\n\n" + fc(ARG1)),
    ("v4", V4_ON, "Let me check the time\n\n" + tc(TOKYO, ("magic_int", [("ref", "false", "42")]))),
    ("v41", V4_OFF, "Checking.\n\n" + dsml("calls", TOKYO, ("toggle", [("enabled", "false", "true")]), sp=" ")),
    ("v3", "", '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{"a": 1\n```'
     '<｜tool▁call▁end｜><｜tool▁calls▁end｜> after'),
]


@pytest.mark.parametrize(("variant", "tail", "reply"), STREAMED)
def test_streamed_equals_whole(variant: Variant, tail: str, reply: str) -> None:
    fmt, c = DeepSeek(variant), ctx(tail)
    whole = fmt.parse(reply, c)
    stream = ReplyStream(fmt, c)
    for ch in reply:
        stream.feed(ch)
    stream.finish()
    got = stream.result()
    assert (got.content, got.reasoning, calls(got)) == (whole.content, whole.reasoning, calls(whole))
    assert whole.calls or whole.broken

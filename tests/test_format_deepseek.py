"""DeepSeek's formats (engine/conversation/formats/deepseek.py, deepseek_dsml.py).

The parse cases are llama.cpp's own, ported from tests/test-chat.cpp (the llama.cpp that swarmtune pins): the
peg_tester blocks of models/templates/deepseek-ai-DeepSeek-V3.1.jinja, -V3.2.jinja, -V4.jinja,
-V4-Flash-0731.jinja, deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja, -R1-Distill-Qwen-32B.jinja and
llama-cpp-deepseek-r1.jinja: the reply, the generation prompt the template ends with (thinking on or off),
and the content, reasoning_content and tool_calls llama.cpp expects. Left out: the continuation cases, which
parse a prefilled assistant message together with the reply. The rest are this format's own rules: which
template gives which variant, V4.1's spaced DSML, a call cut short or malformed, what a stream holds back."""

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmtune.engine.conversation.chat_template import ChatTemplate
from swarmtune.engine.conversation.formats.deepseek import DeepSeek, Variant
from swarmtune.engine.conversation.formats.registry import pick
from swarmtune.engine.conversation.formats.reply import Reply, ReplyContext
from swarmtune.engine.conversation.formats.stream import ReplyStream
from tests.chat_cases import ASSIST
from tests.grammar_check import GrammarCheck, one_call_under_grammar
from tests.llama_templates import template

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


# --- the call grammar (DeepSeek.call_grammar): llama.cpp's grammar sampler over byte tokens (tests/grammar_check)

def fn(name: str, props: dict[str, object], required: tuple[str, ...] = ()) -> dict[str, object]:
    return {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": props, "required": list(required)}}}


G_TOOLS = [fn("special_function", {"arg1": {"type": "integer"}}, ("arg1",)),
           fn("get_time", {"city": {"type": "string"}}, ("city",)),
           fn("write", {"path": {"type": "string"}, "content": {"type": "string"}, "mode": {"enum": ["w", "a"]},
                        "tags": {"type": "array", "items": {"type": "string"}}, "force": {"type": "boolean"}},
              ("path", "content")),
           fn("submit", {})]
G_CTX = ReplyContext(tools=tuple(G_TOOLS))
CODE = 'if a < b:\n    print("</div>", {\'k\': 1})\n'
SINGLE = [("special_function", {"arg1": 1})]
PARALLEL = [("special_function", {"arg1": 1}), ("get_time", {"city": "Tokyo"}), ("submit", {}),
            ("write", {"path": "a.py", "content": CODE, "mode": "a", "tags": ["x<y", "z"], "force": True})]
GRAMMAR_TEMPLATES = [("llama-cpp-deepseek-r1.jinja", "v3"), ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "v3"),
                     ("deepseek-ai-DeepSeek-V3.1.jinja", "v31"), ("deepseek-ai-DeepSeek-V3.2.jinja", "v32"),
                     ("deepseek-ai-DeepSeek-V4.jinja", "v4"), ("deepseek-ai-DeepSeek-V4-Flash-0731.jinja", "v4")]


@pytest.fixture(scope="module")
def check(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrammarCheck]:
    c = GrammarCheck(tmp_path_factory.mktemp("vocab"))
    yield c
    c.close()


def rendered(name: str, *calls_: tuple[str, object]) -> str:
    """A past assistant turn of these calls as the template renders it, from the block's opener on."""
    tool_calls = [{"id": f"call{i}", "type": "function", "function": {"name": n, "arguments": a}}
                  for i, (n, a) in enumerate(calls_)]
    text = ChatTemplate(template(name)).render([{"role": "user", "content": "hi"},
                                                {"role": "assistant", "content": "", "tool_calls": tool_calls}],
                                               add_generation_prompt=False)
    fmt = DeepSeek.for_template(template(name))
    assert fmt is not None
    start = text.rindex(fmt.call_start)
    return text[start:text.index("<｜end▁of▁sentence｜>", start)]


def v41_block(*calls_: tuple[str, dict[str, object]]) -> str:
    """V4.1's spaced DSML (no template of it is vendored), as its encoder writes it."""
    return dsml("calls", *[(n, [(k, "true" if isinstance(v, str) else "false", v if isinstance(v, str)
                                 else json.dumps(v)) for k, v in a.items()]) for n, a in calls_], sp=" ")


@pytest.mark.parametrize(("name", "variant"), GRAMMAR_TEMPLATES)
def test_grammar_holds_the_calls_the_template_writes(check: GrammarCheck, name: str, variant: Variant) -> None:
    fmt = DeepSeek(variant)
    one, many = rendered(name, *SINGLE), rendered(name, *PARALLEL)
    assert check.accepts(fmt.call_grammar(G_TOOLS, False), one)
    assert check.accepts(fmt.call_grammar(G_TOOLS, True), one)
    assert check.accepts(fmt.call_grammar(G_TOOLS, True), many)
    assert not check.accepts(fmt.call_grammar(G_TOOLS, False), many)  # one call, where not parallel
    assert calls(fmt.parse(one, G_CTX)) == SINGLE and calls(fmt.parse(many, G_CTX)) == PARALLEL


def test_v41_grammar_holds_its_spaced_calls(check: GrammarCheck) -> None:
    fmt = DeepSeek("v41")
    for calls_ in (SINGLE, PARALLEL):
        text = v41_block(*calls_)
        assert check.accepts(fmt.call_grammar(G_TOOLS, True), text)
        assert calls(fmt.parse(text, G_CTX)) == calls_
    assert not check.accepts(fmt.call_grammar(G_TOOLS, True), tc(ARG1))  # V4's spelling is not V4.1's


@pytest.mark.parametrize(("variant", "text"), [
    ("v3", V3_CALL),  # llama.cpp's R1 case: no newline before the closing fence
    ("v3", V3_CALL.replace("```<", "\n```\n<")),  # llama-cpp-deepseek-r1's own example
    ("v31", v31(("get_time", '{"city": "XYZCITY"}'))),
    ("v31", v31(("get_time", '{"city": "Paris"}'), ("special_function", '{"arg1": -14}'))),
    ("v32", fc(ARG1)),
    ("v32", fc(("get_time", [("city", "true", "Paris")]), ("special_function", [("arg1", "false", "42")]))),
    ("v4", tc(TOKYO)),
    ("v4", "\n\n" + tc(TOKYO, ARG1)),  # the separator the template writes before the block
    ("v4", tc(("write", [("path", "true", "a.py"), ("content", "true", '  a<b> "q"\n</｜DSML｜invoke>\n')]))),
])
def test_grammar_holds_llama_cpp_calls(check: GrammarCheck, variant: Variant, text: str) -> None:
    fmt = DeepSeek(variant)
    assert check.accepts(fmt.call_grammar(G_TOOLS, True), text)
    r = fmt.parse(text, G_CTX)
    assert r.calls and not r.broken and r.content == ""


@pytest.mark.parametrize(("name", "variant"), GRAMMAR_TEMPLATES[::2] + GRAMMAR_TEMPLATES[3:5])
def test_grammar_refuses_what_the_tools_do_not_allow(check: GrammarCheck, name: str, variant: Variant) -> None:
    grammar = DeepSeek(variant).call_grammar(G_TOOLS, True)
    assert not check.accepts(grammar, rendered(name, ("delete_all", {"arg1": 1})))  # a tool not offered
    assert not check.accepts(grammar, rendered(name, ("special_function", {})))  # a required argument missing
    assert not check.accepts(grammar, rendered(name, ("special_function", {"arg1": "one"})))  # the wrong type
    assert not check.accepts(grammar, rendered(name, ("special_function", {"arg1": 1.5})))
    assert not check.accepts(grammar, rendered(name, ("write", {"path": "a", "content": "b", "mode": "x"})))


@pytest.mark.parametrize("variant", ["v3", "v31", "v32", "v4", "v41"])
def test_lazy_grammar_holds_from_the_blocks_opener(check: GrammarCheck, variant: Variant) -> None:
    fmt = DeepSeek(variant)
    grammar, triggers = fmt.call_grammar(G_TOOLS, True), fmt.triggers()
    block = {"v3": V3_CALL, "v31": v31(("get_time", '{"city": "Paris"}')), "v32": fc(ARG1), "v4": tc(ARG1),
             "v41": v41_block(*SINGLE)}[variant]
    prose = "Let me look: <｜tool▁call▁begin｜> is how a call begins, and <｜DSML｜invoke> too.\n\n"
    assert check.accepts(grammar, prose + block, triggers)
    assert check.accepts(grammar, prose, triggers)  # no call at all
    assert not check.accepts(grammar, prose + block.replace("special_function", "other_function")
                             .replace("get_time", "other_function"), triggers)
    assert calls(fmt.parse(prose + block, G_CTX))


@pytest.mark.parametrize("variant", ["v32", "v4", "v41"])
def test_dsml_text_values_hold_anything_but_their_closer(check: GrammarCheck, variant: Variant) -> None:
    """A string is raw text: code with `<`, quotes, newlines and DSML markup in it is written as is, up to the
    closing tag of either spelling, which would end the value there (in a JSON string too)."""
    fmt = DeepSeek(variant)
    grammar = fmt.call_grammar(G_TOOLS, False)
    block = {"v32": fc, "v4": tc, "v41": lambda *i: dsml("calls", *i, sp=" ")}[variant]

    def write(content: str, *more: tuple[str, str, str]) -> str:
        return block(("write", [("path", "true", "a.py"), ("content", "true", content), *more]))

    for content in (CODE, "</｜DSML｜param", "x </｜DSML｜invoke>\n</｜DSML｜tool_calls>", "", "ends with </｜DSML｜"):
        text = write(content, ("tags", "false", '["<｜DSML｜", "</｜DSML｜parameter"]'))
        assert check.accepts(grammar, text), content
        assert calls(fmt.parse(text, G_CTX)) == [("write", {"path": "a.py", "content": content,
                                                            "tags": ["<｜DSML｜", "</｜DSML｜parameter"]})]
    for content in ("a</｜DSML｜parameter>b", "a</｜DSML｜ parameter>b"):
        assert not check.accepts(grammar, write(content))
        assert not check.accepts(grammar, write("a", ("tags", "false", json.dumps([content], ensure_ascii=False))))
    assert not check.accepts(grammar, write("a", ("tags", "false", '["a\nb"]')))  # strict JSON: no raw newline
    assert not check.accepts(grammar, write("a", ("force", "true", "true")))  # a boolean is JSON
    assert check.accepts(grammar, write("a", ("mode", "true", "w"), ("force", "false", "false")))
    assert not check.accepts(grammar, write("a", ("force", "false", "false"), ("mode", "true", "w")))  # order


def test_v3_json_strings_are_strict(check: GrammarCheck) -> None:
    """The block's parser reads the arguments as strict JSON: a raw control character in a string is none."""
    grammar = DeepSeek("v3").call_grammar(G_TOOLS, False)
    good = rendered("llama-cpp-deepseek-r1.jinja", ("get_time", {"city": "a\nb"}))
    assert check.accepts(grammar, good) and calls(DeepSeek("v3").parse(good, G_CTX)) == [("get_time",
                                                                                         {"city": "a\nb"})]
    assert not check.accepts(grammar, good.replace("\\n", "\n"))


# enums: random weights would write a free string until max_tokens; a grammar cannot make them stop
E2E_TOOL = {"type": "function", "function": {"name": "read_file", "parameters": {
    "type": "object", "properties": {"path": {"enum": ["a.py", "b.py", "setup.cfg"]}, "whole": {"type": "boolean"}},
    "required": ["path", "whole"]}}}


@pytest.mark.parametrize("name", ["llama-cpp-deepseek-r1.jinja", "deepseek-ai-DeepSeek-V3.1.jinja",
                                  "deepseek-ai-DeepSeek-V3.2.jinja", "deepseek-ai-DeepSeek-V4.jinja"])
def test_a_random_model_under_the_grammar_makes_a_call_that_validates(tmp_path: Path, name: str) -> None:
    """Served end to end on a tiny random-weight GGUF carrying the real template, tool_choice required: the
    prompt opens the thinking block, so the call is held from its end (Bridge.held), as the server holds it."""
    r = one_call_under_grammar(tmp_path, name, E2E_TOOL, "deepseek")
    assert isinstance(r.renderer.picked.fmt, DeepSeek) and r.renderer.template is not None

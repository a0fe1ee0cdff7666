"""Qwen's XML tool calls (engine/conversation/formats/qwen_xml.py): Qwen3.5 and Qwen3-Coder.

The parse cases are llama.cpp's own, ported from tests/test-chat.cpp (the peg_testers of
models/templates/Qwen3.5-4B.jinja and models/templates/Qwen3-Coder.jinja, in the llama.cpp that swarmtune
pins): the reply, the tools offered, and the content, reasoning_content and tool_calls llama.cpp expects of
it. Where a case differs from llama.cpp's expectation, a comment says how: llama.cpp keeps the newline that
separates content from a call ("Let me call it.\\n"), where this format drops the blank space next to a call
as the template's (canitoolcall's fixtures expect it so). Left out: the structured-output case (a
response_format grammar, not a reply format) and the continuation cases, which parse the prefilled assistant
message together with the reply. The rest are this format's own rules: what ends a value, a call cut short,
what a stream must hold back."""

import json
from typing import Any

import pytest

from swarmtune.engine.conversation.formats.qwen_xml import QwenCoderXml, QwenXml
from swarmtune.engine.conversation.formats.reply import Reply, ReplyContext
from swarmtune.engine.conversation.formats.stream import ReplyStream
from tests.chat_cases import ASSIST, INTEGER, SPECIAL, SPECIAL_OPT, STRING, tool
from tests.llama_templates import template

THINKING = "<|im_start|>assistant\n<think>\n"  # Qwen3.5's generation prompt, thinking on (the default)
NO_THINKING = "<|im_start|>assistant\n<think>\n\n</think>\n\n"  # enable_thinking=false
CODER = "<|im_start|>assistant\n"




PYTHON = tool("python", code=STRING)
HTML = tool("html", markup=STRING)
TODO = tool("todo_list", todos={"type": "array"})
EDIT = tool("edit", filename=STRING, oldString=STRING, newString=STRING)
TERMINAL = tool("run_in_terminal", command=STRING)
EMPTY = tool("empty_args")
REQ4 = tool("tool_2req_4opt", req1=STRING, req2=INTEGER, opt1=STRING, opt2=INTEGER, opt3=STRING, opt4=INTEGER)
REQ5 = tool("tool_2req_5opt", req1=STRING, req2=INTEGER, opt1=STRING, opt2=INTEGER, opt3=STRING, opt4=INTEGER,
            opt5=STRING)
NULLABLE_STR = tool("set_nullable_str", name={"type": ["string", "null"]})
NULLABLE_STR_NF = tool("set_nullable_str_nf", name={"type": ["null", "string"]})
NULLABLE_INT = tool("set_nullable_int", count={"type": ["integer", "null"]})
UNION = tool("set_union", value={"type": ["string", "object"]}, amount={"type": ["string", "integer"]})
ENUM = tool("set_unit", unit={"enum": ["celsius", "fahrenheit"]})

CALL = "<tool_call>\n<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n</function>\n</tool_call>"
PWD = "<tool_call>\n<function=run_in_terminal>\n<parameter=command>\npwd\n</parameter>\n</function>\n</tool_call>"
TWO_CALLS = (CALL + "\n<tool_call>\n<function=special_function_with_opt>\n<parameter=arg1>\n1\n</parameter>\n"
             "<parameter=arg2>\n2\n</parameter>\n</function>\n</tool_call>")
SPECIAL_CALL = ("special_function", {"arg1": 1})
PWD_CALL = ("run_in_terminal", {"command": "pwd"})
TWO = [SPECIAL_CALL, ("special_function_with_opt", {"arg1": 1, "arg2": 2})]


def fn(name: str, *params: tuple[str, str]) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def calls(r: Reply) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, json.loads(c.arguments)) for c in r.calls]


def ctx(prompt_tail: str, *tools: dict[str, Any]) -> ReplyContext:
    return ReplyContext(prompt_tail=prompt_tail, tools=tools)


# (reply, prompt tail, tools, content, reasoning, calls): tests/test-chat.cpp, the Qwen3.5 peg_tester
QWEN35 = [
    ("I'm\nthinking\n</think>\n\nHello, world!\nWhat's up?", THINKING, (), ASSIST, "I'm\nthinking", []),
    (CALL, NO_THINKING, (SPECIAL,), "", "", [SPECIAL_CALL]),
    ("I'm\nthinking\n</think>\n\n" + CALL, THINKING, (SPECIAL,), "", "I'm\nthinking", [SPECIAL_CALL]),
    (TWO_CALLS, NO_THINKING, (SPECIAL, SPECIAL_OPT), "", "", TWO),
    (fn("python", ("code", 'def hello():\n    print("Hello, world!")\n\nhello()')), NO_THINKING, (PYTHON,), "", "",
     [("python", {"code": 'def hello():\n    print("Hello, world!")\n\nhello()'})]),
    (fn("edit", ("filename", "foo.c"), ("oldString", "#iclunde"), ("newString", "#include")), NO_THINKING, (EDIT,),
     "", "", [("edit", {"filename": "foo.c", "oldString": "#iclunde", "newString": "#include"})]),
    # a value that ends in a newline: "#include\n\n</parameter>", one newline of it markup
    (fn("edit", ("filename", "foo.c"), ("oldString", "#iclunde"), ("newString", "#include\n")), NO_THINKING, (EDIT,),
     "", "", [("edit", {"filename": "foo.c", "oldString": "#iclunde", "newString": "#include\n"})]),
    (fn("python", ("code", '    print("Hello, world!")')), NO_THINKING, (PYTHON,), "", "",
     [("python", {"code": '    print("Hello, world!")'})]),
    # a tool call ends the prefilled thinking block, with or without a closing </think>
    (PWD, THINKING, (TERMINAL,), "", "", [PWD_CALL]),
    ("Need to inspect the current directory.\n" + PWD, THINKING, (TERMINAL,), "",
     "Need to inspect the current directory.", [PWD_CALL]),
    (fn("empty_args"), NO_THINKING, (EMPTY,), "", "", [("empty_args", {})]),
    (fn("empty_args_no_props"), NO_THINKING, (tool("empty_args_no_props"),), "", "", [("empty_args_no_props", {})]),
    # llama.cpp's reasoning here is "<think>\n\n": the thinking block opened twice, its trailing newline kept
    ("<think>\n\n</think>\n\n" + CALL, THINKING, (SPECIAL,), "", "<think>", [SPECIAL_CALL]),
    ("</think>\n\n" + CALL, THINKING, (SPECIAL,), "", "", [SPECIAL_CALL]),
    ("</think>\n\n" + PWD, THINKING, (TERMINAL,), "", "", [PWD_CALL]),
    # llama.cpp keeps the content's "\n" before the call
    ("</think>\n\nLet me inspect the current directory.\n" + PWD, THINKING, (TERMINAL,),
     "Let me inspect the current directory.", "", [PWD_CALL]),
    ("I should inspect the directory.\n</think>\n\nLet me inspect it now.\n" + PWD, THINKING, (TERMINAL,),
     "Let me inspect it now.", "I should inspect the directory.", [PWD_CALL]),
    ("I need to run a terminal command.\n</think>\n\n" + PWD, THINKING, (TODO, TERMINAL), "",
     "I need to run a terminal command.", [PWD_CALL]),
    ("I need to run a terminal command.\n</think>\n\nLet me inspect the current directory.\n" + PWD, THINKING,
     (TODO, TERMINAL), "Let me inspect the current directory.", "I need to run a terminal command.", [PWD_CALL]),
]

# the same, the Qwen3-Coder peg_tester
CODER_CASES = [
    (ASSIST, (), ASSIST, []),
    (CALL, (SPECIAL,), "", [SPECIAL_CALL]),
    # some models skip the opening <tool_call> and go straight to <function=>
    (CALL.removeprefix("<tool_call>\n"), (SPECIAL,), "", [SPECIAL_CALL]),
    ("Let me call it.\n" + CALL.removeprefix("<tool_call>\n"), (SPECIAL,), "Let me call it.", [SPECIAL_CALL]),
    (TWO_CALLS.removeprefix("<tool_call>\n"), (SPECIAL, SPECIAL_OPT), "", TWO),
    (TWO_CALLS, (SPECIAL, SPECIAL_OPT), "", TWO),
    (fn("python", ("code", 'def hello():\n    print("Hello, world!")\n\nhello()')), (PYTHON,), "",
     [("python", {"code": 'def hello():\n    print("Hello, world!")\n\nhello()'})]),
    (fn("python", ("code", "格")), (PYTHON,), "", [("python", {"code": "格"})]),
    (fn("html", ("markup", "<html>\n <head>\n  <title>Hello!</title>\n </head>\n</html>")), (HTML,), "",
     [("html", {"markup": "<html>\n <head>\n  <title>Hello!</title>\n </head>\n</html>"})]),
    (fn("todo_list", ("todos", '[{"item": "Check stuff", "selected": false}, {"item": "Prepare stuff", '
                               '"selected": true}]')), (TODO,), "",
     [("todo_list", {"todos": [{"item": "Check stuff", "selected": False},
                               {"item": "Prepare stuff", "selected": True}]})]),
    (fn("edit", ("newString", "#include"), ("filename", "foo.c"), ("oldString", "#iclunde")), (EDIT,), "",
     [("edit", {"newString": "#include", "filename": "foo.c", "oldString": "#iclunde"})]),
    (fn("tool_2req_4opt", ("req2", "42"), ("req1", "hello"), ("opt2", "200")), (REQ4,), "",
     [("tool_2req_4opt", {"req2": 42, "req1": "hello", "opt2": 200})]),
    (fn("tool_2req_4opt", ("req1", "hello"), ("req2", "42"), ("opt4", "100"), ("opt2", "200")), (REQ4,), "",
     [("tool_2req_4opt", {"req1": "hello", "req2": 42, "opt4": 100, "opt2": 200})]),
    (fn("tool_2req_5opt", ("req1", "world"), ("req2", "7"), ("opt5", "last"), ("opt3", "middle"),
        ("opt1", "first")), (REQ5,), "",
     [("tool_2req_5opt", {"req1": "world", "req2": 7, "opt5": "last", "opt3": "middle", "opt1": "first"})]),
    (fn("tool_2req_5opt", ("req1", "test"), ("req2", "99"), ("opt3", "c"), ("opt1", "a"), ("opt5", "e"),
        ("opt4", "4"), ("opt2", "2")), (REQ5,), "",
     [("tool_2req_5opt", {"req1": "test", "req2": 99, "opt3": "c", "opt1": "a", "opt5": "e", "opt4": 4,
                          "opt2": 2})]),
    (fn("set_nullable_str", ("name", "hello world")), (NULLABLE_STR,), "",
     [("set_nullable_str", {"name": "hello world"})]),
    (fn("set_nullable_str_nf", ("name", "hello world")), (NULLABLE_STR_NF,), "",
     [("set_nullable_str_nf", {"name": "hello world"})]),
    (fn("set_nullable_int", ("count", "42")), (NULLABLE_INT,), "", [("set_nullable_int", {"count": 42})]),
    (fn("set_nullable_str", ("name", "null")), (NULLABLE_STR,), "", [("set_nullable_str", {"name": None})]),
    (fn("set_union", ("value", '{"a": 1}'), ("amount", "2 dollars")), (UNION,), "",
     [("set_union", {"value": {"a": 1}, "amount": "2 dollars"})]),
    (fn("set_union", ("value", "{not valid json"), ("amount", "42")), (UNION,), "",
     [("set_union", {"value": "{not valid json", "amount": 42})]),
    (fn("set_unit", ("unit", "celsius")), (ENUM,), "", [("set_unit", {"unit": "celsius"})]),
]


def formats() -> tuple[QwenXml, QwenXml]:
    qwen35 = QwenXml.for_template(template("Qwen3.5-4B.jinja"))
    coder = QwenXml.for_template(template("Qwen3-Coder.jinja"))
    assert qwen35 is not None and coder is not None
    return qwen35, coder


@pytest.mark.parametrize(("text", "tail", "tools", "content", "reasoning", "expected"), QWEN35)
def test_llama_cpp_qwen35_cases(text: str, tail: str, tools: tuple[dict[str, Any], ...], content: str,
                                reasoning: str, expected: list[object]) -> None:
    r = formats()[0].parse(text, ctx(tail, *tools))
    assert (r.content, r.reasoning, calls(r)) == (content, reasoning, expected)
    assert not r.broken


@pytest.mark.parametrize(("text", "tools", "content", "expected"), CODER_CASES)
def test_llama_cpp_coder_cases(text: str, tools: tuple[dict[str, Any], ...], content: str,
                               expected: list[object]) -> None:
    r = formats()[1].parse(text, ctx(CODER, *tools))
    assert (r.content, r.reasoning, calls(r)) == (content, "", expected)
    assert not r.broken


def test_reasoning_format_none_keeps_the_thinking_in_content() -> None:
    """llama.cpp's case with reasoning_format none (its content also carries the prompt's `<think>\\n`)."""
    text = "I'm\nthinking\n</think>\n\nHello, world!\nWhat's up?"
    r = formats()[0].parse(text, ReplyContext(prompt_tail=THINKING, reasoning=False))
    assert (r.content, r.reasoning) == (text, "")


def test_templates_pick_their_variant() -> None:
    qwen35, coder = formats()
    assert type(qwen35) is QwenXml and qwen35.think_open == "<think>"
    assert type(coder) is QwenCoderXml and coder.think_open == ""
    # Qwen3's Hermes template and GLM's write <tool_call> too, but no <function=…> with <parameter=…>
    for other in ("Qwen-Qwen3-0.6B.jinja", "GLM-4.6.jinja", "GLM-4.7-Flash.jinja",
                  "meetkai-functionary-medium-v3.1.jinja"):
        assert QwenXml.for_template(template(other)) is None


def test_registry_picks_qwen_xml() -> None:
    from swarmtune.engine.conversation.formats.registry import pick

    assert pick(template("Qwen3.5-4B.jinja")).fmt.name == "qwen3-xml"
    assert pick(template("Qwen3-Coder.jinja")).fmt.name == "qwen3-xml"
    assert pick(template("Qwen-Qwen3-0.6B.jinja")).fmt.name == "qwen3-hermes"


def test_markers_inside_a_value_are_its_text() -> None:
    """A value ends at a </parameter> that the next parameter or the call's end follows, not at the first."""
    value = "Close with </parameter> and </function> then </tool_call>; open <parameter=x> or <function=y>."
    r = formats()[0].parse(fn("write_file", ("path", "x.md"), ("content", value)), ctx(NO_THINKING))
    assert calls(r) == [("write_file", {"path": "x.md", "content": value})]


def test_unclosed_values_end_at_the_next_parameter_or_the_calls_end() -> None:
    """vLLM's reading of a </parameter> the model left out."""
    text = ("<tool_call>\n<function=f>\n<parameter=a>\nx\n<parameter=b>\n{\"k\": 1}\n</function>\n</tool_call>")
    r = formats()[0].parse(text, ctx(NO_THINKING, tool("f", a=STRING, b={"type": "object"})))
    assert calls(r) == [("f", {"a": "x", "b": {"k": 1}})]


def test_calls_without_newlines_and_text_after() -> None:
    text = "before<tool_call><function=f><parameter=city>Paris</parameter></function></tool_call>after"
    r = formats()[1].parse(text, ctx(CODER, tool("f", city=STRING)))
    assert (r.content, calls(r)) == ("beforeafter", [("f", {"city": "Paris"})])


def test_a_bare_function_opens_a_call_only_for_an_offered_tool() -> None:
    coder = formats()[1]
    text = "#include <functional>\n<function=nope>\n</function>\n</tool_call>"
    r = coder.parse(text, ctx(CODER, SPECIAL))
    assert (r.content, r.calls) == (text, ())
    # Qwen3.5 thinks, and llama.cpp does not look for a bare <function= in its replies
    bare = CALL.removeprefix("<tool_call>\n")
    assert formats()[0].parse(bare, ctx(NO_THINKING, SPECIAL)).calls == ()


def test_a_call_cut_short_is_dropped_and_said() -> None:
    qwen35 = formats()[0]
    for cut in ("<tool_call>", "<tool_call>\n<function=special_function>\n<parameter=arg1>\n1",
                CALL.removesuffix("</tool_call>")):
        r = qwen35.parse("Sure.\n" + cut, ctx(NO_THINKING, SPECIAL))
        assert (r.content, r.calls) == ("Sure.", ())
        assert "ended inside a call" in r.broken
    r = qwen35.parse("Thinking about it.\n<tool_call>\n<function=special_function>\n", ctx(THINKING, SPECIAL))
    assert (r.content, r.reasoning, r.calls) == ("", "Thinking about it.", ())
    assert r.broken


def test_a_tool_call_tag_that_opens_no_call_stays_content() -> None:
    text = "Qwen writes <tool_call> tags; here is one: " + CALL
    r = formats()[0].parse(text, ctx(NO_THINKING, SPECIAL))
    assert (r.content, calls(r)) == ("Qwen writes <tool_call> tags; here is one:", [SPECIAL_CALL])


def test_a_partial_parse_holds_an_open_call() -> None:
    qwen35 = formats()[0]
    partial = "Let me check.\n" + CALL[:60]
    assert qwen35.parse(partial, ctx(NO_THINKING, SPECIAL), final=False) == Reply("Let me check.")


STREAMED = [
    (formats()[0], ctx(THINKING, SPECIAL, SPECIAL_OPT), "I'm\nthinking\n</think>\n\nLet me see.\n\n" + TWO_CALLS),
    (formats()[0], ctx(THINKING, TERMINAL), "Need to inspect the current directory.\n" + PWD),
    (formats()[0], ctx(THINKING, tool("write_file", path=STRING, content=STRING)),
     "Write.\n</think>\n\n" + fn("write_file", ("path", "x.md"),
                                 ("content", "a </parameter> b </function>\n</tool_call> c\n"))),
    (formats()[1], ctx(CODER, SPECIAL, SPECIAL_OPT), "Let me call it.\n" + TWO_CALLS.removeprefix("<tool_call>\n")),
    (formats()[1], ctx(CODER, tool("f", city=STRING)),
     "before<tool_call><function=f><parameter=city>Paris</parameter></function></tool_call>after <tool_call> x"),
    (formats()[0], ctx(NO_THINKING, SPECIAL), "Sure.\n" + CALL[:70]),
]


@pytest.mark.parametrize(("fmt", "context", "text"), STREAMED)
def test_streamed_one_character_at_a_time_equals_the_whole(fmt: QwenXml, context: ReplyContext, text: str) -> None:
    whole = fmt.parse(text, context)
    stream = ReplyStream(fmt, context)
    for ch in text:
        stream.feed(ch)
    stream.finish()
    got = stream.result()
    assert (got.content, got.reasoning, calls(got), got.broken) == (whole.content, whole.reasoning, calls(whole),
                                                                   whole.broken)


# The call grammar (QwenXml.call_grammar): llama.cpp's own sampler over the replies these models write, and
# every text it lets through read back by the parser into the same call.

NUM, BOOL = {"type": "number"}, {"type": "boolean"}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": STRING, "days": INTEGER, "metric": BOOL, "unit": ENUM["function"][
        "parameters"]["properties"]["unit"], "where": {"type": "object", "properties": {"lat": NUM, "lon": NUM},
                                                    "required": ["lat", "lon"]}, "tags": {"type": "array"}},
    "required": ["city", "days"]}}}
WRITE = {"type": "function", "function": {"name": "write_file", "parameters": {
    "type": "object", "properties": {"path": STRING, "content": STRING}, "required": ["path", "content"]}}}
GRAMMAR_TOOLS = [WEATHER, WRITE, SPECIAL]
# what a model asks of them, as the template renders it (its arguments in the schema's order)
ASKED = [
    ("get_weather", {"city": "Paris", "days": 3}),
    ("get_weather", {"city": "São Paulo\n(BR)", "days": -2, "metric": True, "unit": "celsius",
                     "where": {"lat": -23.5, "lon": -46.6}, "tags": ["a", {"b": None}]}),
    ("get_weather", {"city": "", "days": 0, "metric": False}),
    ("write_file", {"path": "a.c", "content": "#include <stdio.h>\nint main() { return 1 < 2; }\n"}),
    ("write_file", {"path": "x.md", "content": "Close with </parameter> or </function>, open <parameter=x> or "
                                               "<function=y>; </tool_call> ends a call.\n\n  indented\n"}),
    ("write_file", {"path": "<tool_call>", "content": "\n<parameter\n</parameter>\n</parameter >\n"}),
    ("special_function", {"arg1": 1}),
    ("special_function", {}),
]


@pytest.fixture(scope="module")
def checker(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.grammar_check import GrammarCheck

    g = GrammarCheck(tmp_path_factory.mktemp("vocab"))
    yield g
    g.close()


def rendered(name: str, asked: list[tuple[str, dict[str, Any]]]) -> str:
    """The calls as the template renders an assistant message that makes them: from the first <tool_call>."""
    from swarmtune.engine.conversation.chat_template import ChatTemplate

    msgs = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": n, "arguments": a}} for n, a in asked]}]
    text = ChatTemplate(template(name)).render(msgs, GRAMMAR_TOOLS, add_generation_prompt=False)
    reply = text[text.rindex("<|im_start|>assistant"):]
    return reply[reply.index("<tool_call>"):reply.rindex("<|im_end|>")]


VARIANTS = [("Qwen3.5-4B.jinja", NO_THINKING), ("Qwen3-Coder.jinja", CODER)]


@pytest.mark.parametrize(("name", "tail"), VARIANTS)
def test_grammar_accepts_the_templates_calls_and_they_read_back(checker: Any, name: str, tail: str) -> None:
    fmt = QwenXml.for_template(template(name))
    assert fmt is not None
    one, many = fmt.call_grammar(GRAMMAR_TOOLS, parallel=False), fmt.call_grammar(GRAMMAR_TOOLS, parallel=True)
    for asked in ASKED:
        text = rendered(name, [asked])
        assert checker.accepts(one, text) and checker.accepts(many, text), text
        assert calls(fmt.parse(text, ctx(tail, *GRAMMAR_TOOLS))) == [asked]
    text = rendered(name, ASKED)  # the template's parallel calls, one a line
    assert checker.accepts(many, text) and not checker.accepts(one, text)
    assert calls(fmt.parse(text, ctx(tail, *GRAMMAR_TOOLS))) == ASKED


# llama.cpp's cases (above) whose calls the grammar holds: every parameter optional, so the tools' schemas, less
# those whose values come out of the schema's order (llama.cpp's grammar takes the required ones in any order)
HELD = [(CALL, (SPECIAL,)), (TWO_CALLS, (SPECIAL, SPECIAL_OPT)), (PWD, (TERMINAL,)), (fn("empty_args"), (EMPTY,))]
HELD += [(text, tools) for text, tools, _, expected in CODER_CASES[6:] if expected and text.startswith("<tool_call>")]
OUT_OF_ORDER = {"edit", "tool_2req_4opt", "tool_2req_5opt"}


@pytest.mark.parametrize(("text", "tools"), HELD)
def test_grammar_holds_llama_cpps_calls(checker: Any, text: str, tools: tuple[dict[str, Any], ...]) -> None:
    for fmt, tail in zip(formats(), (NO_THINKING, CODER), strict=True):
        r = fmt.parse(text, ctx(tail, *tools))
        assert r.calls and not r.broken
        ordered = not any(c.name in OUT_OF_ORDER for c in r.calls)
        assert checker.accepts(fmt.call_grammar(list(tools), parallel=True), text) == ordered, text


def test_grammar_rejects_what_is_no_call_of_an_offered_tool(checker: Any) -> None:
    for fmt in formats():
        g = fmt.call_grammar(GRAMMAR_TOOLS, parallel=True)
        ok = fn("get_weather", ("city", "Paris"), ("days", "3"))
        assert checker.accepts(g, ok)
        for bad in (fn("get_time", ("city", "Paris")),  # a tool not offered
                    fn("get_weather", ("city", "Paris")),  # a required parameter missing
                    fn("get_weather", ("days", "3")),
                    fn("get_weather", ("city", "Paris"), ("days", "three")),  # wrongly typed
                    fn("get_weather", ("city", "Paris"), ("days", "3.5")),
                    fn("get_weather", ("city", "Paris"), ("days", "3"), ("metric", "yes")),
                    fn("get_weather", ("city", "Paris"), ("days", "3"), ("unit", "kelvin")),
                    fn("get_weather", ("city", "Paris"), ("days", "3"), ("where", '{"lat": 1}')),
                    fn("get_weather", ("city", "Paris"), ("days", "3"), ("tags", '["a\nb"]')),  # not JSON
                    fn("get_weather", ("city", "Paris"), ("days", "3"), ("nope", "1")),  # not a parameter
                    fn("get_weather", ("city", "Paris"), ("days", "3"), ("days", "4")),
                    ok + "\nAnd done.",  # the reply ends with the call
                    ok.replace("\n</function>", "</function>"),
                    ok.removeprefix("<tool_call>\n")):
            expect = bad == ok.removeprefix("<tool_call>\n") and fmt.bare_function  # Coder's opener is optional
            assert checker.accepts(g, bad) == expect, bad


@pytest.mark.parametrize("value", [
    "a\n</parameter>\n<parameter=days>\n3",  # the next parameter, whole
    "a</parameter><parameter=x",
    "a</parameter> \t\n <parameter=",
    "x\n<parameter=days>",  # a parameter on a line of its own
    "<parameter=",  # the same at the value's start, after the template's newline
    "a </function>\n\n</tool_call>",  # the call's end
])
def test_a_string_value_is_any_text_but_what_would_end_it(checker: Any, value: str) -> None:
    """The parser would end the value early at any of these; the grammar refuses them, and nothing else."""
    for fmt in formats():
        g = fmt.call_grammar([WRITE], parallel=False)
        text = fn("write_file", ("path", value), ("content", "x"))
        assert not checker.accepts(g, text)
        for near in (value[:-1], value[1:], value.replace("<", "< "), value.replace("/", "")):
            text = fn("write_file", ("path", near), ("content", "x"))
            if checker.accepts(g, text):
                assert calls(fmt.parse(text, ctx(CODER, WRITE))) == [("write_file", {"path": near, "content": "x"})]


def test_random_string_values_read_back_whenever_the_grammar_takes_them(checker: Any) -> None:
    """Texts made of the closers' pieces: the grammar refuses exactly those holding a closer (its stand-in:
    `<parameter=` for the whole `<parameter=NAME>`), and the parser reads back whole every text it takes."""
    import random
    import re

    rng = random.Random(7)
    pieces = ["</parameter>", "<parameter=", "p>", "\n", " ", "\t", "</function>", "</tool_call>", "<", "/", ">",
              "a", "=", "</", "parameter", "\u3000", "\x0c", "é"]
    closers = re.compile(r"</parameter>\s*<parameter=|\n<parameter=|</function>\s*</tool_call>")
    fmt = formats()[0]
    g = fmt.call_grammar([WRITE], parallel=False)
    taken = 0
    for _ in range(300):
        value = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 6)))
        text = fn("write_file", ("path", "p"), ("content", value))
        accepted = checker.accepts(g, text)
        assert accepted == (closers.search("\n" + value) is None), repr(value)
        if accepted:
            taken += 1
            assert calls(fmt.parse(text, ctx(NO_THINKING, WRITE))) == [("write_file", {"path": "p", "content": value})]
    assert taken > 100


def test_grammar_lazily_after_prose_or_reasoning(checker: Any) -> None:
    qwen35, coder = formats()
    for fmt in formats():
        g, triggers = fmt.call_grammar(GRAMMAR_TOOLS, parallel=True), fmt.triggers()
        assert checker.accepts(g, "Let me check the weather.\n\n" + CALL, triggers)
        assert checker.accepts(g, "No call needed: it is sunny <b>today</b>.", triggers)
        assert not checker.accepts(g, "Calling.\n" + fn("get_time"), triggers)
        assert not checker.accepts(g, "Calling.\n" + CALL + "\nDone.", triggers)
    assert qwen35.triggers() == ("<tool_call>",)
    g = qwen35.call_grammar(GRAMMAR_TOOLS, parallel=True)
    # Qwen3.5's reply starts in reasoning, which a call may end unclosed
    for text in ("I'm\nthinking\n</think>\n\n" + CALL, "Need to look it up.\n" + CALL):
        assert checker.accepts(g, text, qwen35.triggers())
        assert calls(qwen35.parse(text, ctx(THINKING, *GRAMMAR_TOOLS))) == [SPECIAL_CALL]
    # Qwen3-Coder's call may leave out its opener: held from the first token, the grammar allows it; lazily, only
    # <tool_call> triggers it (see QwenXml.call_grammar), so a bare call is the model's own, which the parser reads
    assert coder.triggers() == ("<tool_call>",)
    g = coder.call_grammar(GRAMMAR_TOOLS, parallel=True)
    text = CALL.removeprefix("<tool_call>\n") + "\n" + CALL
    assert checker.accepts(g, text) and not checker.accepts(qwen35.call_grammar(GRAMMAR_TOOLS, parallel=True), text)
    assert calls(coder.parse(text, ctx(CODER, *GRAMMAR_TOOLS))) == [SPECIAL_CALL, SPECIAL_CALL]
    assert checker.accepts(g, "Let me call it.\n" + text, coder.triggers())
    assert not checker.accepts(g, "Let me call it.\n" + text.replace("special", "nonspecial"), coder.triggers())


def test_grammar_types_follow_cast_value() -> None:
    """A union with string, or a schema naming no type, is text (cast_value reads JSON where it is JSON); a
    string enum its words; $defs reach a parameter's $ref; names the parser could not read back are refused."""
    from swarmtune.engine.errors import UserError

    qwen35 = formats()[0]
    g = qwen35.call_grammar([UNION, NULLABLE_STR, ENUM, tool("t", x={"description": "anything"})], parallel=False)
    assert '"celsius" | "fahrenheit"' in g
    ref = {"type": "function", "function": {"name": "r", "parameters": {
        "type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}, "$defs": {"P": {"type": "integer"}}}}}
    assert "f0-v0-root" in qwen35.call_grammar([ref], parallel=False)
    for bad in (tool("a>b"), tool("ok", **{"x\ny": STRING}), tool(" padded")):
        with pytest.raises(UserError):
            qwen35.call_grammar([bad], parallel=False)


@pytest.mark.parametrize("name", ["Qwen3.5-4B.jinja", "Qwen3-Coder.jinja"])
def test_a_random_model_under_the_grammar_makes_a_call_that_validates(tmp_path: Any, name: str) -> None:
    """End to end, as tests/test_tool_families.py: the real template on a tiny random-weight GGUF, one served
    request under the grammar, which ends the reply with the call."""
    from tests.grammar_check import one_call_under_grammar
    from tests.test_tool_families import TOOL

    r = one_call_under_grammar(tmp_path, name, TOOL, name, choice=None, tail=40, steps=800)
    assert r.renderer.family == "qwen3-xml"

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
from tests.llama_templates import template

THINKING = "<|im_start|>assistant\n<think>\n"  # Qwen3.5's generation prompt, thinking on (the default)
NO_THINKING = "<|im_start|>assistant\n<think>\n\n</think>\n\n"  # enable_thinking=false
CODER = "<|im_start|>assistant\n"
ASSIST = "Hello, world!\nWhat's up?"


def tool(tool_name: str, /, **props: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": tool_name, "parameters": {"type": "object", "properties": props}}}


STRING, INTEGER = {"type": "string"}, {"type": "integer"}
SPECIAL = tool("special_function", arg1=INTEGER)
SPECIAL_OPT = tool("special_function_with_opt", arg1=INTEGER, arg2=INTEGER)
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

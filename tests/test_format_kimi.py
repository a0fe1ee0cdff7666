"""Kimi's tool calls (engine/conversation/formats/kimi.py): K2's section of calls and K3's XTML.

The parse cases are llama.cpp's own, ported from tests/test-chat.cpp (the peg_testers of
models/templates/Kimi-K2-Thinking.jinja, Kimi-K2-Instruct.jinja, moonshotai-Kimi-K2.jinja and Kimi-K3.jinja,
in the llama.cpp that swarmtune pins): the reply, the tools offered, whether reasoning is split off
(reasoning_format auto) and the content, reasoning_content and tool_calls llama.cpp expects. Left out: the
continuation cases (they parse a prefilled assistant message with the reply) and the partial-call case (a
stream here sends a call whole, once it is closed). llama.cpp keeps K2's call id (`functions.name:0`) as the
call's id; the ids here are swarmtune's own, so they are not compared. The rest are the format's own rules."""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from swarmtune.engine.conversation.chat_template import ChatTemplate
from swarmtune.engine.conversation.formats.base import Format
from swarmtune.engine.conversation.formats.kimi import Kimi, KimiK3
from swarmtune.engine.conversation.formats.reply import Reply, ReplyContext
from swarmtune.engine.conversation.formats.stream import ReplyStream
from tests.chat_cases import ASSIST, INTEGER, SPECIAL, SPECIAL_OPT, STRING, tool
from tests.grammar_check import GrammarCheck, one_call_under_grammar
from tests.llama_templates import template

K2_PROMPT = "<|im_assistant|>assistant<|im_middle|>"  # the pinned templates' generation prompt: no <think>
K26_THINKING = K2_PROMPT + "<think>"  # K2.6's own template, thinking on
K26_NO_THINKING = K2_PROMPT + "<think></think>"
K3_THINKING = '<|open|>message role="assistant"<|sep|><|open|>think<|sep|>'  # Kimi-K3.jinja, `thinking` true
K3_NO_THINKING = '<|open|>message role="assistant"<|sep|><|open|>response<|sep|>'




PYTHON = tool("python", code=STRING)
HTML = tool("html", markup=STRING)
EMPTY_ARGS = tool("empty_args")
EXECUTE = tool("execute_command", command=STRING, cwd=STRING, timeout=INTEGER)
SPECIAL_CALL = ("special_function", {"arg1": 1})
OPT_CALL = ("special_function_with_opt", {"arg1": 1, "arg2": 2})


def k2(name: str, idx: int, args: str) -> str:
    return f"<|tool_call_begin|>functions.{name}:{idx}<|tool_call_argument_begin|>{args}<|tool_call_end|>"


def section(*calls: str) -> str:
    return "<|tool_calls_section_begin|>" + "".join(calls) + "<|tool_calls_section_end|>"


def k3_call(name: str, idx: int, *args: tuple[str, str, str]) -> str:
    body = "".join(f'<|open|>argument key="{k}" type="{t}"<|sep|>{v}<|close|>argument<|sep|>' for k, t, v in args)
    return f'<|open|>call tool="{name}" index="{idx}"<|sep|>{body}<|close|>call<|sep|>'


def k3_tools(*calls: str) -> str:
    return ("<|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>" + "".join(calls)
            + "<|close|>tools<|sep|><|close|>message<|sep|>")


def calls(r: Reply) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, json.loads(c.arguments)) for c in r.calls]


def ctx(prompt_tail: str, *tools: dict[str, Any], reasoning: bool = True) -> ReplyContext:
    return ReplyContext(prompt_tail=prompt_tail, tools=tools, reasoning=reasoning)


# (template, reply, prompt tail, reasoning split off, tools, content, reasoning, calls)
LLAMA_CPP = [
    # Kimi-K2-Thinking
    ("Kimi-K2-Thinking.jinja", ASSIST, K2_PROMPT, False, (), ASSIST, "", []),
    ("Kimi-K2-Thinking.jinja", section(k2("special_function", 0, '{"arg1": 1}')), K2_PROMPT, False, (SPECIAL,),
     "", "", [SPECIAL_CALL]),
    ("Kimi-K2-Thinking.jinja", "<think>I'm thinking about this</think>" + section(k2("special_function", 0,
     '{"arg1": 1}')), K2_PROMPT, True, (SPECIAL,), "", "I'm thinking about this", [SPECIAL_CALL]),
    ("Kimi-K2-Thinking.jinja", ASSIST + section(k2("special_function", 0, '{"arg1": 1}')), K2_PROMPT, False,
     (SPECIAL,), ASSIST, "", [SPECIAL_CALL]),
    ("Kimi-K2-Thinking.jinja", section(k2("special_function", 0, '{"arg1": 1}'),
                                       k2("special_function_with_opt", 1, '{"arg1": 1, "arg2": 2}')),
     K2_PROMPT, True, (SPECIAL, SPECIAL_OPT), "", "", [SPECIAL_CALL, OPT_CALL]),
    ("Kimi-K2-Thinking.jinja", "<think>I need to call two functions</think>" + section(
        k2("special_function", 0, '{"arg1": 1}'), k2("python", 1, "{\"code\": \"print('hey')\"}")),
     K2_PROMPT, True, (SPECIAL, PYTHON), "", "I need to call two functions",
     [SPECIAL_CALL, ("python", {"code": "print('hey')"})]),
    ("Kimi-K2-Thinking.jinja", section(k2("python", 0, '{"code": "def hello():\\n    print(\\"Hello, world!\\")'
                                                      '\\n\\nhello()"}')), K2_PROMPT, False, (PYTHON,), "", "",
     [("python", {"code": 'def hello():\n    print("Hello, world!")\n\nhello()'})]),
    ("Kimi-K2-Thinking.jinja", section(k2("empty_args", 0, "{}")), K2_PROMPT, False, (EMPTY_ARGS,), "", "",
     [("empty_args", {})]),
    ("Kimi-K2-Thinking.jinja", section(k2("special_function", 0, '{"arg1": 1}'),
                                       k2("python", 1, '{"code": "print(1)"}'),
                                       k2("html", 2, '{"markup": "<p>test</p>"}')),
     K2_PROMPT, True, (SPECIAL, PYTHON, HTML), "", "",
     [SPECIAL_CALL, ("python", {"code": "print(1)"}), ("html", {"markup": "<p>test</p>"})]),
    # calls inside the thinking block: the block ends where they begin
    ("Kimi-K2-Thinking.jinja", "<think>I need to call two functions" + section(
        k2("special_function", 0, '{"arg1": 1}'), k2("python", 1, "{\"code\": \"print('hey')\"}")),
     K2_PROMPT, True, (SPECIAL, PYTHON), "", "I need to call two functions",
     [SPECIAL_CALL, ("python", {"code": "print('hey')"})]),
    # ... and without the section's markers nor the calls' closers
    ("Kimi-K2-Thinking.jinja", "<think>I need to call two functions"
     "<|tool_call_begin|>functions.special_function:0<|tool_call_argument_begin|>{\"arg1\": 1}"
     "<|tool_call_begin|>functions.python:1<|tool_call_argument_begin|>{\"code\": \"print('hey')\"}",
     K2_PROMPT, True, (SPECIAL, PYTHON), "", "I need to call two functions",
     [SPECIAL_CALL, ("python", {"code": "print('hey')"})]),
    ("Kimi-K2-Thinking.jinja", "<|tool_call_begin|>functions.execute_command:0<|tool_call_argument_begin|>"
     '{"command": "ls -lah", "cwd": "/home/user/development/exllamav3", "timeout": 10}', K2_PROMPT, True,
     (EXECUTE,), "", "", [("execute_command", {"command": "ls -lah", "cwd": "/home/user/development/exllamav3",
                                                "timeout": 10})]),
    # Kimi-K2 (old) and Kimi-K2-Instruct
    ("moonshotai-Kimi-K2.jinja", ASSIST, K2_PROMPT, False, (), ASSIST, "", []),
    ("moonshotai-Kimi-K2.jinja", section(k2("special_function", 0, '{"arg1": 1}')), K2_PROMPT, False,
     (SPECIAL,), "", "", [SPECIAL_CALL]),
    ("Kimi-K2-Instruct.jinja", ASSIST, K2_PROMPT, False, (), ASSIST, "", []),
    ("Kimi-K2-Instruct.jinja", section(k2("special_function", 0, '{"arg1": 1}')), K2_PROMPT, False, (SPECIAL,),
     "", "", [SPECIAL_CALL]),
    # Kimi-K3
    ("Kimi-K3.jinja", "<|open|>response<|sep|>" + ASSIST + "<|close|>response<|sep|><|close|>message<|sep|>",
     K3_THINKING, False, (), ASSIST, "", []),
    ("Kimi-K3.jinja", "I'm thinking about this<|close|>think<|sep|><|open|>response<|sep|>" + ASSIST
     + "<|close|>response<|sep|><|close|>message<|sep|>", K3_THINKING, True, (), ASSIST, "I'm thinking about this",
     []),
    ("Kimi-K3.jinja", "<|open|>response<|sep|>Use the response tag, then message the handler."
     "<|close|>response<|sep|><|close|>message<|sep|>", K3_THINKING, False, (),
     "Use the response tag, then message the handler.", "", []),
    ("Kimi-K3.jinja", "I was still thinking when the budget ran out", K3_THINKING, True, (), "",
     "I was still thinking when the budget ran out", []),
    ("Kimi-K3.jinja", k3_tools(k3_call("special_function", 1, ("arg1", "number", "1"))), K3_THINKING, False,
     (SPECIAL,), "", "", [SPECIAL_CALL]),
    ("Kimi-K3.jinja", "I should call it<|close|>think<|sep|><|open|>response<|sep|>On it.<|close|>response<|sep|>"
     "<|open|>tools<|sep|>" + k3_call("special_function", 1, ("arg1", "number", "1"))
     + "<|close|>tools<|sep|><|close|>message<|sep|>", K3_THINKING, True, (SPECIAL,), "On it.", "I should call it",
     [SPECIAL_CALL]),
    ("Kimi-K3.jinja", k3_tools(k3_call("special_function_with_opt", 1, ("arg1", "number", "1"),
                                       ("arg2", "number", "2"))), K3_THINKING, False, (SPECIAL_OPT,), "", "",
     [OPT_CALL]),
    ("Kimi-K3.jinja", k3_tools(k3_call("special_function", 1, ("arg1", "number", "1")),
                               k3_call("special_function_with_opt", 2, ("arg1", "number", "1"),
                                       ("arg2", "number", "2"))), K3_THINKING, False, (SPECIAL, SPECIAL_OPT), "", "",
     [SPECIAL_CALL, OPT_CALL]),
    ("Kimi-K3.jinja", k3_tools(k3_call("python", 1, ("code", "string", "print('hey')"))), K3_THINKING, False,
     (PYTHON,), "", "", [("python", {"code": "print('hey')"})]),
]


def fmt_for(name: str) -> Format:
    fmt = Kimi.for_template(template(name))
    assert fmt is not None
    return fmt


@pytest.mark.parametrize(("name", "text", "tail", "split", "tools", "content", "reasoning", "expected"), LLAMA_CPP)
def test_llama_cpp_cases(name: str, text: str, tail: str, split: bool, tools: tuple[dict[str, Any], ...],
                         content: str, reasoning: str, expected: list[object]) -> None:
    r = fmt_for(name).parse(text, ctx(tail, *tools, reasoning=split))
    assert (r.content, r.reasoning, calls(r)) == (content, reasoning, expected)
    assert not r.broken


def test_templates_pick_kimi() -> None:
    from swarmtune.engine.conversation.formats.registry import pick
    for name in ("Kimi-K2-Instruct.jinja", "moonshotai-Kimi-K2.jinja", "Kimi-K2-Thinking.jinja"):
        fmt = fmt_for(name)
        assert type(fmt) is Kimi and pick(template(name)).fmt.name == "kimi"
    k2 = [fmt_for(name) for name in ("Kimi-K2-Instruct.jinja", "Kimi-K2-Thinking.jinja")]
    assert [isinstance(fmt, Kimi) and fmt.thinking for fmt in k2] == [False, True]
    assert type(fmt_for("Kimi-K3.jinja")) is KimiK3 and pick(template("Kimi-K3.jinja")).fmt.name == "kimi"
    for other in ("Qwen-Qwen3-0.6B.jinja", "GLM-4.7-Flash.jinja", "deepseek-ai-DeepSeek-V3.1.jinja",
                  "openai-gpt-oss-120b.jinja", "Mistral-Small-3.2-24B-Instruct-2506.jinja"):
        assert Kimi.for_template(template(other)) is None


def test_where_the_reply_starts_follows_the_prompt() -> None:
    """K2.6 opens <think> in its prompt, or prefills an empty block with thinking off; the pinned
    K2-Thinking template leaves the opener to the model. A prompt the parse is not told of is the template's
    default: a thinking model's reply starts in reasoning."""
    thinking, instruct = fmt_for("Kimi-K2-Thinking.jinja"), fmt_for("Kimi-K2-Instruct.jinja")
    text = "Sunny, I think.</think>It is sunny."
    for tail in (K26_THINKING, ""):
        r = thinking.parse(text, ctx(tail))
        assert (r.reasoning, r.content) == ("Sunny, I think.", "It is sunny.")
    assert thinking.parse("It is sunny.", ctx(K26_NO_THINKING)).content == "It is sunny."
    assert thinking.parse("It is sunny.", ctx(K2_PROMPT)).content == "It is sunny."
    assert instruct.parse("It is sunny.", ctx("")).content == "It is sunny."
    assert thinking.parse("Still thinking", ctx("")).reasoning == "Still thinking"
    k3 = fmt_for("Kimi-K3.jinja")
    for tail in (K3_THINKING, ""):
        r = k3.parse("Hmm.<|close|>think<|sep|><|open|>response<|sep|>Yes.", ctx(tail))
        assert (r.reasoning, r.content) == ("Hmm.", "Yes.")
    r = k3.parse("Yes.<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>", ctx(K3_NO_THINKING))
    assert (r.reasoning, r.content) == ("", "Yes.")


def test_k2_noise_inside_a_section_is_dropped_and_text_after_it_is_content() -> None:
    weather = tool("get_weather", city=STRING)
    text = ("Before. <|tool_calls_section_begin|> noise <|tool_call_begin|>functions.get_weather:0 "
            '<|tool_call_argument_begin|>{"city": "Tokyo"} <|tool_call_end|><|tool_calls_section_end|> After.')
    r = fmt_for("Kimi-K2-Instruct.jinja").parse(text, ctx(K2_PROMPT, weather))
    assert (r.content, calls(r)) == ("Before.  After.", [("get_weather", {"city": "Tokyo"})])
    empty = fmt_for("Kimi-K2-Instruct.jinja").parse("Hi. " + section(), ctx(K2_PROMPT, weather))
    assert (empty.content, empty.calls) == ("Hi. ", ())


def test_k2_a_closer_inside_the_arguments_is_their_text() -> None:
    value = "stop at <|tool_call_end|> and <|tool_calls_section_end|> please"
    text = section(k2("write", 0, json.dumps({"content": value})))
    r = fmt_for("Kimi-K2-Thinking.jinja").parse(text, ctx(K26_NO_THINKING, tool("write", content=STRING)))
    assert calls(r) == [("write", {"content": value})]


def test_k2_a_call_outside_a_section_that_does_not_parse_stays_content() -> None:
    bad = "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{bad}<|tool_call_end|>"
    text = "A " + bad + " B " + k2("f", 1, '{"a": 2}') + " C"
    r = fmt_for("Kimi-K2-Instruct.jinja").parse(text, ctx(K2_PROMPT))
    assert (r.content, calls(r)) == ("A " + bad + " B  C", [("f", {"a": 2})])
    assert r.broken


def test_k2_the_name_comes_from_the_id() -> None:
    text = section("<|tool_call_begin|>get_weather:3<|tool_call_argument_begin|>{}<|tool_call_end|>",
                   k2("ns.tool", 4, "{}"))
    assert [c.name for c in fmt_for("Kimi-K2-Instruct.jinja").parse(text, ctx(K2_PROMPT)).calls] == [
        "get_weather", "ns.tool"]


def test_k3_values_typed_by_the_schema_else_by_the_tag() -> None:
    call = k3_call("f", 1, ("n", "number", "15"), ("s", "string", "15"), ("b", "boolean", "false"),
                   ("z", "null", "null"), ("o", "object", '{"a": [1, 2]}'), ("free", "number", "2.5"),
                   ("q&amp;a", "string", "fish & chips"))
    r = fmt_for("Kimi-K3.jinja").parse(k3_tools(call), ctx(K3_NO_THINKING, tool("f", n=INTEGER, s=STRING)))
    assert calls(r) == [("f", {"n": 15, "s": "15", "b": False, "z": None, "o": {"a": [1, 2]}, "free": 2.5,
                               "q&a": "fish & chips"})]


def test_k3_a_closer_inside_a_value_is_its_text() -> None:
    """Values are raw text: a closer ends one only where the next argument or the call's end follows."""
    value = "<|close|>argument<|sep|> is how args end"
    r = fmt_for("Kimi-K3.jinja").parse(k3_tools(k3_call("write", 1, ("path", "string", "x.txt"),
                                                        ("content", "string", value))),
                                       ctx(K3_NO_THINKING, tool("write", path=STRING, content=STRING)))
    assert calls(r) == [("write", {"path": "x.txt", "content": value})]


def test_a_call_cut_short_is_dropped_and_said() -> None:
    weather = tool("get_weather", city=STRING)
    cases = [(fmt_for("Kimi-K2-Instruct.jinja"), K2_PROMPT,
              "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
              '{"city": "Madrid"'),
             (fmt_for("Kimi-K3.jinja"), K3_NO_THINKING,
              '<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|>'
              '<|open|>argument key="city" type="string"<|sep|>Madrid')]
    for fmt, tail, text in cases:
        for n in range(max(text.find("<|tool_call_begin|>"), text.find("<|open|>call")), len(text)):
            r = fmt.parse("Checking." + text[:n], ctx(tail, weather))
            assert r.calls == () and "<|" not in r.content, text[:n]
        assert fmt.parse("Checking." + text, ctx(tail, weather)).broken


def test_while_a_call_is_open_it_is_held() -> None:
    text = "Checking." + section(k2("f", 0, '{"a": 1}'))[:-len("<|tool_call_end|><|tool_calls_section_end|>")]
    r = fmt_for("Kimi-K2-Instruct.jinja").parse(text, ctx(K2_PROMPT), final=False)
    assert (r.content, r.calls) == ("Checking.", ())
    assert calls(fmt_for("Kimi-K2-Instruct.jinja").parse(text, ctx(K2_PROMPT))) == [("f", {"a": 1})]


STREAMED = [
    ("Kimi-K2-Thinking.jinja", ctx(K26_THINKING, SPECIAL, SPECIAL_OPT),
     "Two calls.</think>On it." + section(k2("special_function", 0, '{"arg1": 1}'),
                                          k2("special_function_with_opt", 1, '{"arg1": 1, "arg2": 2}')) + " Done."),
    ("Kimi-K2-Thinking.jinja", ctx("", SPECIAL), "Thinking <tool_call_end>"
     "<|tool_call_begin|>functions.special_function:0<|tool_call_argument_begin|>{\"arg1\": 1}"),
    ("Kimi-K2-Instruct.jinja", ctx(K2_PROMPT, SPECIAL), "Sure." + section(k2("special_function", 0,
                                                                            '{"arg1": 1}'))[:90]),
    ("Kimi-K2-Instruct.jinja", ctx(K2_PROMPT, SPECIAL),
     section(k2("special_function", 0, "{bad}"), k2("special_function", 1, '{"arg1": 2}'))),
    ("Kimi-K2-Instruct.jinja", ctx(K2_PROMPT, SPECIAL),
     "A " + k2("special_function", 0, "{bad}") + " B " + k2("special_function", 1, '{"arg1": 2}') + " C"),
    ("Kimi-K3.jinja", ctx("", SPECIAL, SPECIAL_OPT),
     "Plan.<|close|>think<|sep|><|open|>response<|sep|>On it.<|close|>response<|sep|><|open|>tools<|sep|>"
     + k3_call("special_function", 1, ("arg1", "number", "1"))
     + k3_call("special_function_with_opt", 2, ("arg1", "number", "1"), ("arg2", "number", "2"))
     + "<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>"),
    ("Kimi-K3.jinja", ctx(K3_NO_THINKING, tool("write", content=STRING)),
     "<|close|>response<|sep|>" + k3_tools(k3_call("write", 1, ("content", "string",
                                                                  "a<|close|>argument<|sep|>b<|close|>call<|sep|>")))),
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


# --- the call grammars (Kimi.call_grammar, KimiK3.call_grammar): llama.cpp's grammar sampler over byte tokens

def fn(name: str, props: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": props, "required": list(required)}}}


G_TOOLS = [fn("special_function", {"arg1": INTEGER}, ("arg1",)), fn("get_time", {"city": STRING}, ("city",)),
           fn("write", {"path": STRING, "content": STRING, "mode": {"enum": ["w", "a"]},
                        "tags": {"type": "array", "items": STRING}, "force": {"type": "boolean"},
                        "limit": {"type": ["integer", "null"]}}, ("path", "content")),
           fn("submit", {})]
CODE = 'if a < b:\n    print("<|close|>", {\'k\': 1})\n'
SINGLE = [("special_function", {"arg1": 1})]
PARALLEL = [("special_function", {"arg1": 1}), ("get_time", {"city": "Tokyo"}), ("submit", {}),
            ("write", {"path": "a.py", "content": CODE, "mode": "a", "tags": ["x<y", "z"], "force": True,
                       "limit": None})]
K2_CTX = ctx(K2_PROMPT, *G_TOOLS)
K3_CTX = ctx(K3_NO_THINKING, *G_TOOLS)


@pytest.fixture(scope="module")
def check(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrammarCheck]:
    c = GrammarCheck(tmp_path_factory.mktemp("vocab"))
    yield c
    c.close()


def rendered(name: str, *calls_: tuple[str, Any], opener: str, end: str) -> str:
    """A past assistant turn of these calls as the template renders it, from `opener` to before `end`."""
    tool_calls = [{"id": f"call{i}", "type": "function", "function": {"name": n, "arguments": a}}
                  for i, (n, a) in enumerate(calls_)]
    text = ChatTemplate(template(name)).render([{"role": "user", "content": "hi"},
                                                {"role": "assistant", "content": "", "tool_calls": tool_calls}],
                                               add_generation_prompt=False)
    start = text.rindex(opener)
    return text[start:text.index(end, start)]


def k2_rendered(name: str, *calls_: tuple[str, Any]) -> str:
    return rendered(name, *calls_, opener="<|tool_calls_section_begin|>", end="<|im_end|>")


def k3_rendered(*calls_: tuple[str, Any], opener: str = "<|open|>tools<|sep|>") -> str:
    return rendered("Kimi-K3.jinja", *calls_, opener=opener, end="<|close|>message<|sep|>")


@pytest.mark.parametrize("name", ["Kimi-K2-Instruct.jinja", "Kimi-K2-Thinking.jinja", "moonshotai-Kimi-K2.jinja"])
def test_k2_grammar_holds_the_calls_the_template_writes(check: GrammarCheck, name: str) -> None:
    """The section as the template writes it (a call held from the first token opens it), and from the first
    call's opener, where a lazy grammar starts (the trigger); one call, or several where parallel."""
    fmt = fmt_for(name)
    one, many = k2_rendered(name, *SINGLE), k2_rendered(name, *PARALLEL)
    for text in (one, one[len("<|tool_calls_section_begin|>"):], one.removesuffix("<|tool_calls_section_end|>")):
        assert check.accepts(fmt.call_grammar(G_TOOLS, False), text)
        assert check.accepts(fmt.call_grammar(G_TOOLS, True), text)
        assert calls(fmt.parse(text, K2_CTX)) == SINGLE
    assert check.accepts(fmt.call_grammar(G_TOOLS, True), many)
    assert not check.accepts(fmt.call_grammar(G_TOOLS, False), many)  # one call, where not parallel
    assert calls(fmt.parse(many, K2_CTX)) == PARALLEL


def test_k3_grammar_holds_the_calls_the_template_writes(check: GrammarCheck) -> None:
    """From the tools element's opener (a lazy grammar's trigger), or from the empty response channel the
    template closes before it (a call held from the first token); then the message's end, or not."""
    fmt = fmt_for("Kimi-K3.jinja")
    for calls_ in (SINGLE, PARALLEL):
        for opener in ("<|open|>tools<|sep|>", "<|open|>response<|sep|>", "<|close|>response<|sep|>"):
            text = k3_rendered(*calls_, opener=opener)
            for ending in ("", "<|close|>message<|sep|>", "<|close|>message<|sep|><|end_of_msg|>"):
                assert check.accepts(fmt.call_grammar(G_TOOLS, True), text + ending)
                assert calls(fmt.parse(text + ending, K3_CTX)) == calls_
    assert check.accepts(fmt.call_grammar(G_TOOLS, False), k3_rendered(*SINGLE))
    assert not check.accepts(fmt.call_grammar(G_TOOLS, False), k3_rendered(*PARALLEL))


@pytest.mark.parametrize(("name", "text"), [
    ("Kimi-K2-Thinking.jinja", section(k2("special_function", 0, '{"arg1": 1}'))),
    ("Kimi-K2-Thinking.jinja", section(k2("special_function", 0, '{"arg1": 1}'),
                                       k2("get_time", 1, '{"city": "Paris"}'))),
    ("Kimi-K2-Instruct.jinja", section(k2("write", 12, '{"path": "a", "content": "<|tool_call_end|>"}'))),
    ("Kimi-K2-Thinking.jinja", "<|tool_call_begin|>functions.special_function:0<|tool_call_argument_begin|>"
     '{"arg1": -3}<|tool_call_end|>'),
    ("Kimi-K3.jinja", k3_tools(k3_call("special_function", 1, ("arg1", "number", "1")))),
    ("Kimi-K3.jinja", k3_tools(k3_call("special_function", 1, ("arg1", "number", "1")),
                               k3_call("get_time", 2, ("city", "string", "Paris")))),
    ("Kimi-K3.jinja", k3_tools(k3_call("write", 1, ("path", "string", "a.py"), ("content", "string", CODE),
                                       ("limit", "number", "12")))),
])
def test_grammar_holds_llama_cpp_calls(check: GrammarCheck, name: str, text: str) -> None:
    fmt = fmt_for(name)
    assert check.accepts(fmt.call_grammar(G_TOOLS, True), text)
    r = fmt.parse(text, K3_CTX if name == "Kimi-K3.jinja" else K2_CTX)
    assert r.calls and not r.broken and r.content == ""


def test_grammar_refuses_what_the_tools_do_not_allow(check: GrammarCheck) -> None:
    k2, k3 = fmt_for("Kimi-K2-Instruct.jinja"), fmt_for("Kimi-K3.jinja")
    for fmt, write in ((k2, lambda *c: k2_rendered("Kimi-K2-Instruct.jinja", *c)), (k3, k3_rendered)):
        grammar = fmt.call_grammar(G_TOOLS, True)
        assert not check.accepts(grammar, write(("delete_all", {"arg1": 1})))  # a tool not offered
        assert not check.accepts(grammar, write(("special_function", {})))  # a required argument missing
        assert not check.accepts(grammar, write(("special_function", {"arg1": "one"})))  # the wrong type
        assert not check.accepts(grammar, write(("special_function", {"arg1": 1.5})))
        assert not check.accepts(grammar, write(("write", {"path": "a", "content": "b", "mode": "x"})))
        assert not check.accepts(grammar, write(("submit", {"extra": 1})))


@pytest.mark.parametrize("name", ["Kimi-K2-Instruct.jinja", "Kimi-K3.jinja"])
def test_lazy_grammar_holds_from_the_trigger(check: GrammarCheck, name: str) -> None:
    fmt = fmt_for(name)
    grammar, triggers = fmt.call_grammar(G_TOOLS, True), fmt.triggers()
    if name == "Kimi-K3.jinja":
        block, c = k3_rendered(*SINGLE, opener="<|close|>response<|sep|>"), K3_CTX
    else:
        block, c = k2_rendered(name, *SINGLE), K2_CTX
    prose = "Let me look: a call opens with <|open|>call and <|tool_calls_section_begin|>.\n"
    assert check.accepts(grammar, prose + block, triggers)
    assert check.accepts(grammar, prose, triggers)  # no call at all
    assert not check.accepts(grammar, prose + block.replace("special_function", "other_function"), triggers)
    assert calls(fmt.parse(prose + block, c)) == SINGLE


def test_k3_text_values_hold_anything_but_their_closer(check: GrammarCheck) -> None:
    """A string is raw text: code with `<`, quotes, newlines and XTML markup in it is written as is, up to the
    argument's closer (in a JSON string too: the parser could end the value there)."""
    fmt = fmt_for("Kimi-K3.jinja")
    grammar = fmt.call_grammar(G_TOOLS, False)

    def write(content: str, **more: Any) -> str:
        return k3_rendered(("write", {"path": "a.py", "content": content, **more}))

    for content in (CODE, "<|close|>argument", "x<|close|>call<|sep|><|close|>tools<|sep|>", "", "<|close|>argu",
                    " \n spaced \n "):
        text = write(content, tags=["<|close|>argument<|se", "<|"])
        assert check.accepts(grammar, text), content
        assert calls(fmt.parse(text, K3_CTX)) == [("write", {"path": "a.py", "content": content,
                                                            "tags": ["<|close|>argument<|se", "<|"]})]
    assert not check.accepts(grammar, write("a<|close|>argument<|sep|>b"))
    assert not check.accepts(grammar, write("a", tags=["a<|close|>argument<|sep|>b"]))
    assert not check.accepts(grammar, write("a", tags=["a\nb"]).replace("\\n", "\n"))  # strict JSON
    assert not check.accepts(grammar, write("a", force=True).replace('type="boolean"', 'type="string"'))
    for limit in (3, None):
        text = write("a", limit=limit)
        assert check.accepts(grammar, text) and json.loads(fmt.parse(text, K3_CTX).calls[0].arguments)["limit"] == limit
    assert check.accepts(grammar, write("a", mode="w", force=False))
    assert not check.accepts(grammar, k3_rendered(("write", {"force": False, "path": "a.py", "content": "a"})))


# enums: random weights would write a free string until max_tokens; a grammar cannot make them stop
E2E_TOOL = {"type": "function", "function": {"name": "read_file", "parameters": {
    "type": "object", "properties": {"path": {"enum": ["a.py", "b.py", "setup.cfg"]}, "whole": {"type": "boolean"}},
    "required": ["path", "whole"]}}}


@pytest.mark.parametrize("name", ["Kimi-K2-Instruct.jinja", "Kimi-K3.jinja"])
def test_a_random_model_under_the_grammar_makes_a_call_that_validates(tmp_path: Path, name: str) -> None:
    """Served end to end on a tiny random-weight GGUF carrying the real template, tool_choice required (K3's
    prompt opens its think channel, so the call is held from the channel's end, as the server holds it)."""
    r = one_call_under_grammar(tmp_path, name, E2E_TOOL, "kimi")
    assert r.renderer.family == "kimi" and r.renderer.template is not None

"""Gemma 4's format (engine/conversation/formats/gemma4.py).

The parse cases are llama.cpp's own, ported from tests/test-chat.cpp's "Google Gemma 4" block (the
peg_tester of models/templates/google-gemma-4-31B-it.jinja, in the llama.cpp that swarmtune pins): the reply,
and the content, reasoning_content and tool_calls llama.cpp expects of it. Left out: the continuation cases,
which parse the prefilled assistant message together with the reply, and the prompt-rendering checks. The
rest are this format's own rules: object-notation values, where a reply may end, what a stream holds back."""

import json

import pytest

from swarmtune.engine.conversation.formats.gemma4 import Gemma4
from swarmtune.engine.conversation.formats.registry import pick
from swarmtune.engine.conversation.formats.reply import Reply, ReplyContext
from swarmtune.engine.conversation.formats.stream import ReplyStream
from tests.llama_templates import template

FMT = Gemma4()
THINKING_OFF = ReplyContext(prompt_tail="<|turn>model\n<|channel>thought\n<channel|>")
THINKING_ON = ReplyContext(prompt_tail="<|turn>model\n")
ASSIST = "Hello, world!\nWhat's up?"


def calls(r: Reply) -> list[tuple[str, object]]:
    return [(c.name, json.loads(c.arguments)) for c in r.calls]


def call(args: str) -> str:
    return "<|tool_call>call:" + args + "<tool_call|>"


# (reply, content, reasoning, calls): tests/test-chat.cpp, Google Gemma 4
LLAMA_CPP = [
    ("Hello, world!", "Hello, world!", "", []),
    ("<|channel>thought\nI'm\nthinking<channel|>Hello, world!\nWhat's up?", ASSIST, "I'm\nthinking", []),
    ("<|channel>thought<channel|>Hello, world!\nWhat's up?", ASSIST, "", []),
    (call('get_time{city:<|"|>London<|"|>}'), "", "", [("get_time", {"city": "London"})]),
    (call('get_time{city:<|"|>San Francisco<|"|>}'), "", "", [("get_time", {"city": "San Francisco"})]),
    (call("empty_args{}"), "", "", [("empty_args", {})]),
    ("Hello, world!\nWhat's up?" + call('get_time{city:<|"|>Paris<|"|>}'), ASSIST, "",
     [("get_time", {"city": "Paris"})]),
    ("<|channel>thought\nI'm\nthinking<channel|>" + call('get_time{city:<|"|>Paris<|"|>}'), "", "I'm\nthinking",
     [("get_time", {"city": "Paris"})]),
    (call('get_time{city:<|"|>London<|"|>}') + call('get_weather{city:<|"|>Paris<|"|>}'), "", "",
     [("get_time", {"city": "London"}), ("get_weather", {"city": "Paris"})]),
    (call("special_function{arg1:42}"), "", "", [("special_function", {"arg1": 42})]),
    (call("special_function{arg1:-7}"), "", "", [("special_function", {"arg1": -7})]),
    (call("amount{orig:3.14}"), "", "", [("amount", {"orig": 3.14})]),
    (call("toggle{enabled:true}"), "", "", [("toggle", {"enabled": True})]),
    (call("toggle{enabled:false}"), "", "", [("toggle", {"enabled": False})]),
    (call("set_nullable{value:null}"), "", "", [("set_nullable", {"value": None})]),
    (call('todo_list{todos:[<|"|>buy milk<|"|>,<|"|>walk dog<|"|>]}'), "", "",
     [("todo_list", {"todos": ["buy milk", "walk dog"]})]),
    (call('set_config{config:{theme:<|"|>dark<|"|>,count:3}}'), "", "",
     [("set_config", {"config": {"theme": "dark", "count": 3}})]),
    (call("todo_list{todos:[]}"), "", "", [("todo_list", {"todos": []})]),
    (call("set_config{config:{}}"), "", "", [("set_config", {"config": {}})]),
    (call("amount{orig:1.5e10}"), "", "", [("amount", {"orig": 1.5e10})]),
    # edge cases: an empty thought, a stray <channel|>, a trailing empty thought, an empty channel
    ("<|channel>thought\n<channel|>Hello, world!\nWhat's up?<channel|>", ASSIST, "", []),
    ("<|channel>thought\n<channel|>Hello, world!\nWhat's up?<|channel>thought\n<channel|>", ASSIST, "", []),
    ("<|channel>thought\n<channel|>Hello, world!\nWhat's up?<|channel>thought\n<channel|><channel|>", ASSIST, "", []),
    ("<|channel><|channel>thought\n<channel|>Hello, world!\nWhat's up?", ASSIST, "", []),
]


@pytest.mark.parametrize(("text", "content", "reasoning", "expected"), LLAMA_CPP)
def test_llama_cpp_cases(text: str, content: str, reasoning: str, expected: list[object]) -> None:
    r = FMT.parse(text, THINKING_ON)
    assert (r.content, r.reasoning, calls(r)) == (content, reasoning, expected)
    assert not r.broken


def test_reasoning_format_none_keeps_the_thought_as_content() -> None:
    text = "<|channel>thought\nI'm\nthinking<channel|>Hello, world!\nWhat's up?"
    r = FMT.parse(text, ReplyContext(prompt_tail="<|turn>model\n", reasoning=False))
    assert (r.content, r.reasoning) == (text, "")


def test_object_notation_values() -> None:
    text = call('record{flag:false,key with space:1.5e-05,none:null,obj:{a:[1, <|"|>t<|"|>],B:1},'
                's:<|"|>x,y} "q" <|tool_call>call:f{}<tool_call|><|"|>, list:[[10,<|"|>e<|"|>]]}')
    assert calls(FMT.parse(text, THINKING_OFF)) == [("record", {
        "flag": False, "key with space": 1.5e-05, "none": None, "obj": {"a": [1, "t"], "B": 1},
        "s": 'x,y} "q" <|tool_call>call:f{}<tool_call|>', "list": [[10, "e"]]})]


def test_text_around_calls_is_content_verbatim() -> None:
    r = FMT.parse("Some text before " + call('get_weather{location:<|"|>Tokyo<|"|>}') + " after", THINKING_OFF)
    assert r.content == "Some text before  after"
    assert calls(r) == [("get_weather", {"location": "Tokyo"})]


def test_a_reply_cut_inside_a_call_keeps_the_calls_before_it() -> None:
    first = call('get_weather{city:<|"|>Paris<|"|>}')
    for cut in ("<|tool_call>call:get", '<|tool_call>call:f{city:<|"|>Par', '<|tool_call>call:f{n:4',
                '<|tool_call>call:f{a:{b:tr'):
        r = FMT.parse(first + cut, THINKING_OFF)
        assert (r.content, calls(r)) == ("", [("get_weather", {"city": "Paris"})])
        assert r.broken


def test_a_call_that_is_no_call_stays_content() -> None:
    text = "<|tool_call>call:bad_func no brace<tool_call|>"
    r = FMT.parse(text, THINKING_OFF)
    assert (r.content, r.calls) == (text, ())
    assert r.broken


def test_a_thought_cut_short_is_reasoning() -> None:
    r = FMT.parse("<|channel>thought\nThe user wants the current weather", THINKING_ON)
    assert (r.content, r.reasoning) == ("", "The user wants the current weather")


def test_the_template_picks_gemma4_and_no_other_does() -> None:
    for name in ("google-gemma-4-31B-it.jinja", "google-gemma-4-31B-it-interleaved.jinja"):
        assert isinstance(pick(template(name)).fmt, Gemma4)
    for other in ("Qwen-Qwen3-0.6B.jinja", "openai-gpt-oss-120b.jinja", "google-gemma-2-2b-it.jinja",
                  "Qwen3-Coder.jinja", "GLM-4.7-Flash.jinja"):
        assert Gemma4.for_template(template(other)) is None


def test_the_prompt_never_leaves_the_reply_inside_the_thought() -> None:
    assert not FMT.starts_in_reasoning(THINKING_OFF)
    assert not FMT.starts_in_reasoning(THINKING_ON)


STREAMED = [text for text, *_ in LLAMA_CPP] + [
    "<|channel>thought\nPlan <channel|> it.\n<channel|>Let me look. " + call('f{q:<|"|>a <channel|> b<|"|>,n:-1.5e3}')
    + call("g{}") + " Done <|channel> here",
    "Some text" + call('f{a:[1, 2, {b:<|"|>c'),
    "<|channel>thought\nCut short in the th",
]


@pytest.mark.parametrize("text", STREAMED)
def test_streamed_one_character_at_a_time_equals_whole(text: str) -> None:
    ctx = THINKING_ON
    whole = FMT.parse(text, ctx)
    stream = ReplyStream(FMT, ctx)
    for ch in text:
        stream.feed(ch)
    stream.finish()
    got = stream.result()
    assert (got.content, got.reasoning, calls(got)) == (whole.content, whole.reasoning, calls(whole))

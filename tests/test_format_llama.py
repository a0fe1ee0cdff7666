"""Llama's tool calls (engine/conversation/formats/llama3.py): Llama 3.x's bare JSON calls and Llama 4's
Python list of calls.

The parse cases of llama.cpp's own are few, ported from tests/test-chat.cpp (the peg_testers of
models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja, meta-llama-Llama-3.2-3B-Instruct.jinja and
meta-llama-Llama-3.3-70B-Instruct.jinja, in the llama.cpp that swarmtune pins): a plain answer with tools
offered stays content. Left out: the continuation cases and the response-format cases (structured output, not
calls). The rest are the format's rules, as Meta's templates and prompt-format docs write the calls and vLLM's
llama3_json / llama4_pythonic parsers read them: a reply is calls only where the whole of it is."""

import json
from typing import Any

import pytest

from swarmtune.engine.conversation.formats.llama3 import BAD, CUT, Llama3, scan_json
from swarmtune.engine.conversation.formats.reply import Reply, ReplyContext
from swarmtune.engine.conversation.formats.stream import ReplyStream
from tests.chat_cases import ASSIST, SPECIAL, STRING, tool
from tests.llama_templates import template

TEMPLATES = ("meta-llama-Llama-3.1-8B-Instruct.jinja", "meta-llama-Llama-3.2-3B-Instruct.jinja",
             "meta-llama-Llama-3.3-70B-Instruct.jinja")




PYTHON = tool("python", code=STRING)
WEATHER = tool("get_weather", city=STRING)
CTX = ReplyContext(tools=(SPECIAL, PYTHON, WEATHER))


def calls(r: Reply) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, json.loads(c.arguments)) for c in r.calls]


def fmt_for(name: str) -> Llama3:
    fmt = Llama3.for_template(template(name))
    assert fmt is not None
    return fmt


@pytest.mark.parametrize("name", TEMPLATES)
def test_llama_cpp_a_plain_answer_is_content(name: str) -> None:
    r = fmt_for(name).parse(ASSIST, CTX)
    assert (r.content, r.reasoning, r.calls, r.broken) == (ASSIST, "", (), "")


def test_templates_pick_llama() -> None:
    from swarmtune.engine.conversation.formats.registry import pick
    for name in TEMPLATES:
        assert pick(template(name)).fmt.name == "llama"
    # Llama 3's header tokens, but calls of their own
    for other in ("meetkai-functionary-medium-v3.1.jinja", "meetkai-functionary-medium-v3.2.jinja",
                  "fireworks-ai-llama-3-firefunction-v2.jinja", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
                  "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", "Mistral-Small-3.2-24B-Instruct-2506.jinja"):
        assert Llama3.for_template(template(other)) is None


# (reply, content, calls): Meta's two shapes, and what vLLM's parsers read
CASES = [
    ('{"name": "special_function", "parameters": {"arg1": 1}}', "", [("special_function", {"arg1": 1})]),
    ('{"name": "special_function", "arguments": {"arg1": 1}}', "", [("special_function", {"arg1": 1})]),
    ('<|python_tag|>{\n    "type": "function",\n    "name": "get_weather",\n    "parameters": {"city": "Oslo"}\n}',
     "", [("get_weather", {"city": "Oslo"})]),
    ('Let me check. <|python_tag|>{"name": "get_weather", "parameters": {"city": "Tokyo"}}', "Let me check. ",
     [("get_weather", {"city": "Tokyo"})]),
    ('{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_weather", "parameters": {"city": '
     '"Rome"}}', "", [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]),
    ('{"name": "python", "parameters": {"code": "print(\\"<|python_tag|> {}\\")"}}', "",
     [("python", {"code": 'print("<|python_tag|> {}")'})]),
    ('<|python_tag|>brave_search.call(query="weather in Oslo")', "", [("brave_search", {"query": "weather in Oslo"})]),
    ("[get_weather(city='LA'), special_function(arg1=1)]", "",
     [("get_weather", {"city": "LA"}), ("special_function", {"arg1": 1})]),
    ("<|python_start|>[special_function(arg1=-2), python()]<|python_end|>", "",
     [("special_function", {"arg1": -2}), ("python", {})]),
    ("[f(a=None, b=True, c={'k': (1, 2)}, _d='x')]", "", [("f", {"a": None, "b": True, "c": {"k": [1, 2]},
                                                                 "_d": "x"})]),
    # a JSON answer, or a call with more after it, is not calls: the reply stays as written
    ('{"capital": "Paris"}', '{"capital": "Paris"}', []),
    ('{"name": "Ada", "born": 1815}', '{"name": "Ada", "born": 1815}', []),
    ('{"a": 1} is a dict', '{"a": 1} is a dict', []),
    ("{}", "{}", []),
    ('{"name": "get_weather", "parameters": {}} is how I would call it',
     '{"name": "get_weather", "parameters": {}} is how I would call it', []),
    ('Call {"name": "get_weather", "parameters": {}}', 'Call {"name": "get_weather", "parameters": {}}', []),
    ("[1, 2, 3]", "[1, 2, 3]", []),
    ("[a link](https://example.com)", "[a link](https://example.com)", []),
    ("[f(1)]", "[f(1)]", []),
]


@pytest.mark.parametrize(("text", "content", "expected"), CASES)
def test_calls_and_content(text: str, content: str, expected: list[object]) -> None:
    r = fmt_for(TEMPLATES[-1]).parse(text, CTX)
    assert (r.content, calls(r)) == (content, expected)
    assert not r.broken


def test_a_reply_that_may_become_a_call_is_held_until_it_is_one_or_is_not() -> None:
    fmt = fmt_for(TEMPLATES[-1])
    call = '{"name": "get_weather", "parameters": {"city": "Oslo"}}'
    for n in range(len(call) + 1):
        r = fmt.parse(call[:n], CTX, final=False)
        assert (r.content, r.calls) == ("", ()), call[:n]
    assert fmt.parse(call + " and", CTX, final=False).content == call + " and"
    assert fmt.parse('{"x": 1}', CTX, final=False).content == '{"x": 1}'  # whole, and no call
    assert fmt.parse("[get_weather(city='Oslo')]", CTX, final=False).calls == ()
    assert fmt.parse("[see", CTX, final=False).content == ""
    assert fmt.parse("[see]", CTX, final=False).content == "[see]"


def test_a_call_cut_short() -> None:
    fmt = fmt_for(TEMPLATES[-1])
    tagged = fmt.parse('Checking. <|python_tag|>{"name": "get_weather", "parameters": {"city": "Os', CTX)
    assert (tagged.content, tagged.calls) == ("Checking. ", ())
    assert tagged.broken
    # bare, it may have been a JSON answer: the text stays
    bare = fmt.parse('{"name": "get_weather", "parameters": {"city": "Os', CTX)
    assert (bare.content, bare.calls) == ('{"name": "get_weather", "parameters": {"city": "Os', ())
    assert bare.broken
    assert fmt.parse('[get_weather(city="Os', CTX).calls == ()


def test_after_the_tag_what_is_no_call_stays_content() -> None:
    r = fmt_for(TEMPLATES[-1]).parse("<|python_tag|>print('hi')", CTX)
    assert (r.content, r.calls) == ("<|python_tag|>print('hi')", ())
    assert r.broken


@pytest.mark.parametrize(("text", "end"), [
    ('{"a": "}{", "b": [1, {"c": null}]} tail', 34), ('{"a": 1', CUT), ('{"a": tr', CUT), ('{"a": -', CUT),
    ('{"a": 1.5e', CUT), ('{"a": "x\\', CUT), ('{"a" 1}', BAD), ('{"a": nul}', BAD), ("{'a': 1}", BAD),
    ('{"a": [1,]}', BAD), ("[]", 2), ('"s"', 3), ("12 ", 2), ("12", CUT),
])
def test_scan_json(text: str, end: int) -> None:
    assert scan_json(text, 0) == end


STREAMED = [
    '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "special_function", "parameters": '
    '{"arg1": 1}}',
    'Let me check. <|python_tag|>{"name": "get_weather", "parameters": {"city": "Tokyo"}}<|eom_id|>',
    '{"name": "get_weather", "parameters": {}} is how I would call it',
    "<|python_start|>[get_weather(city='LA'), special_function(arg1=1)]<|python_end|>",
    "[a link](https://example.com) and {braces}",
    '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Os',
    '{"a": 1}',
]


@pytest.mark.parametrize("text", STREAMED)
def test_streamed_one_character_at_a_time_equals_the_whole(text: str) -> None:
    fmt = fmt_for(TEMPLATES[-1])
    whole = fmt.parse(text, CTX)
    stream = ReplyStream(fmt, CTX)
    for ch in text:
        stream.feed(ch)
    stream.finish()
    got = stream.result()
    assert (got.content, got.reasoning, calls(got), got.broken) == (whole.content, whole.reasoning, calls(whole),
                                                                   whole.broken)

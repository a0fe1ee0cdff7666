"""Gemma 4's format (engine/conversation/formats/gemma4.py).

The parse cases are llama.cpp's own, ported from tests/test-chat.cpp's "Google Gemma 4" block (the
peg_tester of models/templates/google-gemma-4-31B-it.jinja, in the llama.cpp that swarmtune pins): the reply,
and the content, reasoning_content and tool_calls llama.cpp expects of it. Left out: the continuation cases,
which parse the prefilled assistant message together with the reply, and the prompt-rendering checks. The
rest are this format's own rules: object-notation values, where a reply may end, what a stream holds back."""

import json
import re
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest

from swarmtune.engine.conversation.chat_template import ChatTemplate
from swarmtune.engine.conversation.formats.gemma4 import Gemma4
from swarmtune.engine.conversation.formats.registry import pick
from swarmtune.engine.conversation.formats.reply import Reply, ReplyContext
from swarmtune.engine.conversation.formats.stream import ReplyStream
from swarmtune.engine.errors import UserError
from tests.chat_cases import ASSIST
from tests.grammar_check import GrammarCheck, one_call_under_grammar
from tests.llama_templates import template

FMT = Gemma4()
THINKING_OFF = ReplyContext(prompt_tail="<|turn>model\n<|channel>thought\n<channel|>")
THINKING_ON = ReplyContext(prompt_tail="<|turn>model\n")


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


# The call grammar (Gemma4.call_grammar): the call in Gemma's notation, written from the tools' schemas

def fn(name: str, props: dict[str, object], required: tuple[str, ...] = ()) -> dict[str, object]:
    return {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": props, "required": list(required)}}}


STRING = {"type": "string"}
G_TOOLS = [fn("get_time", {"city": STRING}, ("city",)), fn("get_weather", {"city": STRING}, ("city",)),
           fn("empty_args", {}), fn("special_function", {"arg1": {"type": "integer"}}, ("arg1",)),
           fn("amount", {"orig": {"type": "number"}}, ("orig",)), fn("toggle", {"enabled": {"type": "boolean"}},
                                                                       ("enabled",)),
           fn("set_nullable", {"value": {"type": ["string", "null"]}}, ("value",)),
           fn("todo_list", {"todos": {"type": "array", "items": STRING}}, ("todos",)),
           fn("set_config", {"config": {"type": "object", "properties": {"theme": STRING,
                                                                         "count": {"type": "integer"}}}}, ("config",)),
           fn("write", {"path": STRING, "content": STRING, "mode": {"enum": ["w", "a"]},
                        "Force": {"type": "boolean"}}, ("path", "content"))]
G_CTX = ReplyContext(prompt_tail="<|turn>model\n", tools=tuple(G_TOOLS))
TEMPLATES = ["google-gemma-4-31B-it.jinja", "google-gemma-4-31B-it-interleaved.jinja"]
CODE = 'if a < b and c > {"k": [1, 2]}:\n    print("<|tool_call>call:f{}<tool_call|>", \'<|"\', "|>")\n'


@pytest.fixture(scope="module")
def check(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrammarCheck]:
    c = GrammarCheck(tmp_path_factory.mktemp("vocab"))
    yield c
    c.close()


def rendered(name: str, *calls_: tuple[str, object]) -> str:
    """A past assistant turn of these calls as the template renders it, the calls only."""
    tool_calls = [{"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
                  for i, (n, a) in enumerate(calls_)]
    text = ChatTemplate(template(name)).render([{"role": "user", "content": "hi"},
                                                {"role": "assistant", "content": "", "tool_calls": tool_calls}],
                                               G_TOOLS, add_generation_prompt=False)
    start = text.index("<|tool_call>", text.index("<|turn>model"))
    return text[start:text.rindex("<tool_call|>") + len("<tool_call|>")]


# what the model writes from the reply's start: llama.cpp's cases (text before a call is for the lazy grammar)
FORCED = [(text, expected) for text, _, _, expected in LLAMA_CPP if expected and text.startswith("<|")]
WRITE = ("write", {"Force": True, "content": CODE, "mode": "a", "path": "a.py"})


@pytest.mark.parametrize("name", TEMPLATES)
def test_grammar_holds_the_calls_the_template_writes(check: GrammarCheck, name: str) -> None:
    one = rendered(name, WRITE)
    many = rendered(name, ("get_time", {"city": "Tokyo"}), WRITE,
                    ("set_config", {"config": {"theme": "x", "count": 2}}), ("todo_list", {"todos": ["a<b", "c, d"]}),
                    ("empty_args", {}))
    assert '<|"|>,Force:true,mode:' in one  # the template sorts the keys, case aside
    for parallel in (False, True):
        assert check.accepts(FMT.call_grammar(G_TOOLS, parallel), one)
    assert check.accepts(FMT.call_grammar(G_TOOLS, True), many)
    assert not check.accepts(FMT.call_grammar(G_TOOLS, False), many)  # one call, where not parallel
    assert calls(FMT.parse(one, G_CTX)) == [WRITE]
    assert calls(FMT.parse(many, G_CTX)) == [("get_time", {"city": "Tokyo"}), WRITE,
                                             ("set_config", {"config": {"count": 2, "theme": "x"}}),
                                             ("todo_list", {"todos": ["a<b", "c, d"]}), ("empty_args", {})]


@pytest.mark.parametrize(("text", "expected"), FORCED)
def test_grammar_holds_llama_cpp_calls(check: GrammarCheck, text: str, expected: list[object]) -> None:
    """From the first token: a thought channel may come first, as the model begins with thinking on; the
    properties in the schema's order as well as the template's (llama.cpp's set_config case)."""
    assert check.accepts(FMT.call_grammar(G_TOOLS, True), text)
    assert check.accepts(FMT.call_grammar(G_TOOLS, False), text) == (len(expected) == 1)
    r = FMT.parse(text, G_CTX)
    assert calls(r) == expected and not r.broken and r.content == ""


@pytest.mark.parametrize("text", [
    call('delete_all{city:<|"|>x<|"|>}'),  # a tool not offered
    call("special_function{}"),  # a required argument missing
    call('special_function{arg1:<|"|>1<|"|>}'),  # the wrong type
    call("special_function{arg1:1.5}"),
    call("get_time{city:London}"),  # a string unquoted
    call("get_time{city:3}"),
    call('write{content:<|"|>x<|"|>,mode:<|"|>r<|"|>,path:<|"|>p<|"|>}'),  # not in the enum
    call('write{content:<|"|>x<|"|>,path:<|"|>p<|"|>,other:1}'),  # a property the schema does not have
    call('get_time{city:<|"|>a<|"|>b<|"|>}'),  # the quote ends the string
    call('set_config{config:{theme:3}}'),
    call('get_time{"city":<|"|>London<|"|>}'),  # JSON is not the notation
    'Hi' + call('get_time{city:<|"|>London<|"|>}'),  # text before a forced call
    "<|channel>thought\nDone<channel|>",  # the reply may not end before its call
])
def test_grammar_refuses_what_the_tools_do_not_allow(check: GrammarCheck, text: str) -> None:
    assert not check.accepts(FMT.call_grammar(G_TOOLS, True), text)


@pytest.mark.parametrize("value", [CODE, "", "<", "<|", '<|"', '<|"|', "a <|tool_call> <channel|> }, x:1", "\n\n"])
def test_string_values_hold_anything_but_the_quote(check: GrammarCheck, value: str) -> None:
    text = call(f'write{{content:<|"|>{value}<|"|>,path:<|"|>{value}<|"|>}}')
    assert check.accepts(FMT.call_grammar(G_TOOLS, False), text)
    assert calls(FMT.parse(text, G_CTX)) == [("write", {"content": value, "path": value})]


def test_thought_text_holds_anything_but_its_closer(check: GrammarCheck) -> None:
    grammar = FMT.call_grammar(G_TOOLS, False)
    for thought in ("", "\nPlan <channel <channel| <|tool_call>call:x{} <|channel>", "<<channel"):
        text = "<|channel>thought" + thought + "<channel|>" + call("empty_args{}")
        assert check.accepts(grammar, text), thought
        assert FMT.parse(text, G_CTX).reasoning == thought.strip()
    assert not check.accepts(grammar, "<|channel>thought\na<channel|>b<channel|>" + call("empty_args{}"))


def test_lazy_grammar_holds_from_the_calls_opener(check: GrammarCheck) -> None:
    grammar, triggers = FMT.call_grammar(G_TOOLS, True), FMT.triggers()
    prose = "<|channel>thought\nWrite {city:<|\"|>x<|\"|>} then.<channel|>Hello, world!\nWhat's up? "
    one = call('get_time{city:<|"|>Paris<|"|>}')
    for text in (prose + one, prose + one + one, prose, prose + rendered(TEMPLATES[0], WRITE)):
        assert check.accepts(grammar, text, triggers), text
    assert not check.accepts(FMT.call_grammar(G_TOOLS, False), prose + one + one, triggers)
    assert not check.accepts(grammar, prose + one.replace("get_time", "get_date"), triggers)
    assert not check.accepts(grammar, prose + one + " Done.", triggers)  # the calls end the reply
    r = FMT.parse(prose + one, G_CTX)
    assert calls(r) == [("get_time", {"city": "Paris"})] and r.content == "Hello, world!\nWhat's up? "


RICH = {"type": "object", "$defs": {"node": {"type": "object", "properties": {
    "name": STRING, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["name"]}},
    "properties": {
        "tree": {"$ref": "#/$defs/node"},
        "when": {"anyOf": [{"type": "integer"}, {"const": "now"}]},
        "level": {"enum": [1, 2.5, "high", True, None, {"B": [1], "a": "x"}]},
        "tags": {"type": "array", "items": STRING, "minItems": 1, "maxItems": 2},
        "env": {"type": "object", "additionalProperties": STRING},
        "any": {},
        "odd key: }": {"type": ["integer", "null"]},
        "both": {"allOf": [{"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]},
                           {"properties": {"y": {"type": "boolean"}}}]},
    }, "required": ["tree", "tags"]}
RICH_TOOL = {"type": "function", "function": {"name": "rich", "parameters": RICH}}
RICH_VALUES = [
    {"tree": {"name": "r"}, "tags": ["a"]},
    {"tree": {"kids": [{"name": "k", "kids": []}, {"name": "<|\"x"}], "name": "r"}, "tags": ["a", "b"],
     "when": -12, "level": {"B": [1], "a": "x"}, "env": {"PATH": "/bin", "Content-Type": "a b"},
     "any": {"k": [1.5e-7, None, True, {"z": "<"}]}, "odd key: }": None, "both": {"x": 1.5, "y": False}},
    {"tree": {"name": ""}, "tags": ["a"], "when": "now", "level": 2.5, "odd key: }": 7, "both": {"x": -3}},
    {"tree": {"name": "r"}, "tags": ["a"], "level": None, "any": "text"},
]


def notation(value: object) -> str:
    """A value in Gemma's notation, as the template's format_argument writes it."""
    if isinstance(value, str):
        return '<|"|>' + value + '<|"|>'
    if isinstance(value, dict):
        return "{" + ",".join((k if ":" not in k else '<|"|>' + k + '<|"|>') + ":" + notation(v)
                              for k, v in sorted(value.items(), key=lambda kv: kv[0].lower())) + "}"
    if isinstance(value, list):
        return "[" + ",".join(notation(v) for v in value) + "]"
    return json.dumps(value)


@pytest.mark.parametrize("args", RICH_VALUES)
def test_notation_is_written_from_the_schema(check: GrammarCheck, args: dict[str, object]) -> None:
    """Nested objects, arrays, refs (recursive), anyOf, const, enums of any value, additionalProperties,
    allOf, a type list, a key that must be quoted: what the grammar lets through is the value to the reader,
    and it validates."""
    text = call("rich" + notation(args))
    assert check.accepts(FMT.call_grammar([RICH_TOOL], False), text), text
    (name, got), = calls(FMT.parse(text, G_CTX))
    assert (name, got) == ("rich", args)
    jsonschema.validate(got, RICH)


@pytest.mark.parametrize("args", [
    {"tags": ["a"]},  # required missing
    {"tree": {"kids": []}, "tags": ["a"]},  # required missing, down a $ref
    {"tree": {"name": "r"}, "tags": []},  # minItems
    {"tree": {"name": "r"}, "tags": ["a", "b", "c"]},  # maxItems
    {"tree": {"name": "r"}, "tags": ["a"], "when": "later"},
    {"tree": {"name": "r"}, "tags": ["a"], "level": "low"},
    {"tree": {"name": "r"}, "tags": ["a"], "env": {"n": 1}},
    {"tree": {"name": "r"}, "tags": ["a"], "both": {"y": True}},
    {"tree": {"name": "r"}, "tags": ["a"], "odd key: }": "x"},
])
def test_notation_refuses_what_the_schema_does_not_allow(check: GrammarCheck, args: dict[str, object]) -> None:
    assert not check.accepts(FMT.call_grammar([RICH_TOOL], False), call("rich" + notation(args)))


def test_openapi_nullable_allows_null(check: GrammarCheck) -> None:
    grammar = FMT.call_grammar([fn("f", {"n": {"type": "integer", "nullable": True}}, ("n",))], False)
    for value, expected in (("null", None), ("-3", -3)):
        assert check.accepts(grammar, call(f"f{{n:{value}}}"))
        assert calls(FMT.parse(call(f"f{{n:{value}}}"), G_CTX)) == [("f", {"n": expected})]
    assert not check.accepts(grammar, call('f{n:<|"|>3<|"|>}'))


def test_a_schema_the_notation_cannot_hold_is_the_clients_error() -> None:
    with pytest.raises(UserError):
        FMT.call_grammar([fn("f", {"a": {"enum": ['<|"|>']}})], False)
    with pytest.raises(UserError):
        FMT.call_grammar([fn("f", {"a": {"$ref": "#/$defs/missing"}})], False)


# enums: random weights would write a free string until max_tokens; a grammar cannot make them stop
E2E_TOOL = {"type": "function", "function": {"name": "read_file", "parameters": {
    "type": "object", "properties": {"path": {"enum": ["a.py", "b.py", "setup.cfg"]}, "whole": {"type": "boolean"}},
    "required": ["path", "whole"]}}}


def test_a_random_model_under_the_grammar_makes_a_call_that_validates(tmp_path: Path) -> None:
    """Served end to end on a tiny random-weight GGUF carrying the real template, tool_choice required, the
    grammar held from the reply's first token (thinking on: the prompt ends at `<|turn>model\\n`). Random
    weights never close a thought, so one would run to max_tokens: with this seed the model calls at once."""
    r = one_call_under_grammar(tmp_path, TEMPLATES[0], E2E_TOOL, "gemma4")
    assert isinstance(r.renderer.picked.fmt, Gemma4) and r.renderer.template is not None
    assert r.text.endswith("<|turn>model\n")
    assert not r.triggers
    assert re.fullmatch(r"<\|tool_call>call:read_file\{.*\}<tool_call\|>", r.out, re.S), r.out

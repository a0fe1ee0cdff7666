"""gpt-oss's Harmony format (engine/conversation/formats/harmony.py).

The parse cases are llama.cpp's own, ported from tests/test-chat.cpp's "GPT-OSS format tests" (the
peg_tester of models/templates/openai-gpt-oss-120b.jinja, in the llama.cpp that swarmtune pins): the reply,
and the content, reasoning_content and tool_calls llama.cpp expects of it. Left out: the structured-output
case (a response_format grammar, not a reply format) and the continuation cases, which parse the prefilled
assistant message together with the reply. The rest are this format's own rules: where a reply may end,
what a stream must hold back, and what the prompt may leave open."""

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmtune.engine.conversation.chat_template import ChatTemplate
from swarmtune.engine.conversation.formats.harmony import Harmony
from swarmtune.engine.conversation.formats.registry import pick
from swarmtune.engine.conversation.formats.reply import Reply, ReplyContext
from swarmtune.engine.conversation.formats.stream import ReplyStream
from tests.chat_cases import ASSIST
from tests.grammar_check import GrammarCheck, one_call_under_grammar
from tests.llama_templates import template

FMT = Harmony()
CTX = ReplyContext(prompt_tail="<|start|>assistant")
CALL = ("special_function", {"arg1": 1})


def calls(r: Reply) -> list[tuple[str, dict[str, object]]]:
    return [(c.name, json.loads(c.arguments)) for c in r.calls]


# (reply, content, reasoning, calls): tests/test-chat.cpp, GPT-OSS format tests
LLAMA_CPP = [
    ("<|channel|>final<|message|>Hello, world!\nWhat's up?", ASSIST, "", []),
    ("<|channel|>commentary<|message|>Hello, world!\nWhat's up?", ASSIST, "", []),
    ("<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>final<|message|>Hello, world!\n"
     "What's up?", ASSIST, "I'm\nthinking", []),
    (" to=functions.special_function<|channel|>analysis<|message|>{\"arg1\": 1}", "", "", [CALL]),
    ("<|channel|>analysis to=functions.special_function<|message|>{\"arg1\": 1}", "", "", [CALL]),
    (" to=functions.special_function<|channel|>analysis <|constrain|>json<|message|>{\"arg1\": 1}", "", "", [CALL]),
    ("<|channel|>commentary to=functions.special_function<|message|>{\"arg1\": 1}", "", "", [CALL]),
    ("<|channel|>analysis<|message|>I'm\nthinking<|end|>"
     "<|start|>assistant to=functions.special_function<|channel|>analysis<|message|>{\"arg1\": 1}",
     "", "I'm\nthinking", [CALL]),
    ("<|channel|>analysis<|message|>Thinking about edit...<|end|>"
     "<|start|>assistant<|channel|>commentary to=functions.edit <|constrain|>json"
     "<|message|>{\"oldString\": \"if (part < railCount - 1) {\", \"newString\": \"if (part < 4) {\", "
     "\"replaceAll\": false}",
     "", "Thinking about edit...",
     [("edit", {"oldString": "if (part < railCount - 1) {", "newString": "if (part < 4) {", "replaceAll": False})]),
    # unsolicited calls to built-in tools: llama.cpp returns no content for them
    ("<|channel|>analysis<|message|>I will execute python to say hello<|end|>"
     "<|start|>assistant to=container.exec<|channel|>commentary<|message|>python3 -c 'print(\"hello\")'",
     "", "I will execute python to say hello", []),
    ("<|channel|>analysis<|message|>I will execute python to say hello<|end|>"
     "<|start|>assistant<|channel|>commentary to=python <|constrain|>code<|message|>print(\"hello\")",
     "", "I will execute python to say hello", []),
    # a stray "<|channel|>commentary to=assistant" before the reasoning, and before the final message
    ("<|channel|>commentary to=assistant<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant"
     "<|channel|>final<|message|>Hello, world!\nWhat's up?", ASSIST, "I'm\nthinking", []),
    ("<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>commentary to=assistant"
     "<|channel|>final<|message|>Hello, world!\nWhat's up?", ASSIST, "I'm\nthinking", []),
]


@pytest.mark.parametrize(("text", "content", "reasoning", "expected"), LLAMA_CPP)
def test_llama_cpp_cases(text: str, content: str, reasoning: str, expected: list[object]) -> None:
    r = FMT.parse(text, CTX)
    assert (r.content, r.reasoning, calls(r)) == (content, reasoning, expected)
    assert not r.broken


def test_reasoning_format_none_keeps_the_analysis_message_as_content() -> None:
    """llama.cpp's case with reasoning_format none: the analysis message stays, header and all."""
    text = "<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>final<|message|>" + ASSIST
    r = FMT.parse(text, ReplyContext(prompt_tail="<|start|>assistant", reasoning=False))
    assert r.content == "<|channel|>analysis<|message|>I'm\nthinking<|end|>" + ASSIST
    assert r.reasoning == ""


def test_analysis_cut_short_is_reasoning() -> None:
    """llama.cpp's partial case: an analysis message still being written is reasoning so far."""
    for final in (False, True):
        r = FMT.parse("<|channel|>analysis<|message|>I'm\nthinking", CTX, final=final)
        assert (r.content, r.reasoning, r.calls) == ("", "I'm\nthinking", ())


def test_preamble_then_call_and_markers_inside_text_and_arguments() -> None:
    text = ("<|channel|>analysis<|message|>I must not write <|call|> or <|channel|>final myself.<|end|>"
            "<|start|>assistant<|channel|>commentary<|message|>One moment.<|end|>"
            "<|start|>assistant to=functions.write<|channel|>commentary json<|message|>"
            '{"text": "ends with <|call|>; a message with <|end|>"}')
    r = FMT.parse(text, CTX)
    assert r.reasoning == "I must not write <|call|> or <|channel|>final myself."
    assert r.content == "One moment."
    assert calls(r) == [("write", {"text": "ends with <|call|>; a message with <|end|>"})]


def test_calls_on_after_the_stop_token() -> None:
    """With the stop not applied, `<|call|>` separates a call from the next message."""
    text = ('<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.a<|channel|>commentary'
            '<|constrain|>json<|message|>{"n": 1}<|call|><|start|>assistant<|channel|>commentary to=functions.b'
            '<|message|>{}<|call|><|start|>assistant<|channel|>final<|message|>Done')
    r = FMT.parse(text, CTX)
    assert calls(r) == [("a", {"n": 1}), ("b", {})]
    assert (r.content, r.reasoning) == ("Done", "x")


def test_a_reply_cut_inside_a_call_has_no_call() -> None:
    for text in (' to=functions.get<|channel|>commentary <|constrain|>json<|message|>{"city": "Par',
                 ' to=functions.get<|channel|>commentary <|constrain|>json'):
        r = FMT.parse("<|channel|>analysis<|message|>Go.<|end|><|start|>assistant" + text, CTX)
        assert (r.content, r.reasoning, r.calls) == ("", "Go.", ())
        assert r.broken


def test_malformed_arguments_stay_content() -> None:
    text = " to=functions.get<|channel|>commentary<|message|>{city: Paris}<|end|>"
    r = FMT.parse(text, CTX)
    assert r.calls == () and r.broken
    assert r.content == " to=functions.get<|channel|>commentary<|message|>{city: Paris}"


def test_garbled_headers_are_skipped() -> None:
    text = "<|channel|>??<|end|><|start|>assistant<|channel|>analysis<|message|>We must comply."
    r = FMT.parse(text, CTX)
    assert (r.content, r.reasoning, r.calls) == ("", "We must comply.", ())


def test_a_prompt_that_opens_the_analysis_message() -> None:
    ctx = ReplyContext(prompt_tail="<|start|>assistant<|channel|>analysis<|message|>")
    assert FMT.starts_in_reasoning(ctx)
    assert not FMT.starts_in_reasoning(CTX)
    r = FMT.parse("I'm thinking<|end|><|start|>assistant<|channel|>final<|message|>Hi", ctx)
    assert (r.content, r.reasoning) == ("Hi", "I'm thinking")


def test_the_template_picks_harmony_and_no_other_does() -> None:
    assert isinstance(pick(template("openai-gpt-oss-120b.jinja")).fmt, Harmony)
    for other in ("Qwen-Qwen3-0.6B.jinja", "google-gemma-4-31B-it.jinja", "GLM-4.7-Flash.jinja",
                  "Kimi-K2-Instruct.jinja", "meta-llama-Llama-3.3-70B-Instruct.jinja"):
        assert Harmony.for_template(template(other)) is None


STREAMED = [text for text, *_ in LLAMA_CPP] + [
    '<|channel|>analysis<|message|>Write <|call|> here.<|end|><|start|>assistant<|channel|>commentary<|message|>'
    'Checking.<|end|><|start|>assistant to=functions.write<|channel|>commentary <|constrain|>json<|message|>'
    '{"text": "a <|end|> b"}<|call|><|start|>assistant<|channel|>final<|message|>Done <|return|> now',
    "<|channel|>analysis<|message|>Cut short in the ar",
    ' to=functions.f<|channel|>commentary<|message|>{"a": [1, 2',
]


@pytest.mark.parametrize("text", STREAMED)
def test_streamed_one_character_at_a_time_equals_whole(text: str) -> None:
    whole = FMT.parse(text, CTX)
    stream = ReplyStream(FMT, CTX)
    for ch in text:
        stream.feed(ch)
    stream.finish()
    got = stream.result()
    assert (got.content, got.reasoning, calls(got)) == (whole.content, whole.reasoning, calls(whole))


# The call grammar (Harmony.call_grammar, Harmony.triggers)

def fn(name: str, props: dict[str, object], required: tuple[str, ...]) -> dict[str, object]:
    return {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": props, "required": list(required)}}}


G_TOOLS = [fn("special_function", {"arg1": {"type": "integer"}}, ("arg1",)),
           fn("edit", {"oldString": {"type": "string"}, "newString": {"type": "string"},
                       "replaceAll": {"type": "boolean"}}, ("oldString", "newString")),
           fn("write", {"path": {"type": "string"}, "text": {"type": "string"}}, ("path", "text"))]
EDIT = ("edit", {"oldString": "if (part < railCount - 1) {", "newString": "if (part < 4) {", "replaceAll": False})


@pytest.fixture(scope="module")
def check(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrammarCheck]:
    c = GrammarCheck(tmp_path_factory.mktemp("vocab"))
    yield c
    c.close()


def rendered(name: str, args: object) -> str:
    """A past call as the template renders it: the message after `<|start|>assistant`, up to its `<|call|>`
    (the stop token, which the reply does not hold)."""
    call = {"id": "c0", "type": "function", "function": {"name": name, "arguments": args}}
    text = ChatTemplate(template("openai-gpt-oss-120b.jinja")).render(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [call]}],
        G_TOOLS, add_generation_prompt=False)
    # greedy: the message's own <|call|>, not one inside its arguments
    m = re.search(r"<\|start\|>assistant( to=functions\.[^<]*<\|channel\|>.*)<\|call\|>", text, re.S)
    assert m, text[-300:]
    return m.group(1)


def model_call(name: str, args: str) -> str:
    """A call message as gpt-oss writes one (llama.cpp's test-chat.cpp, the Harmony spec)."""
    return f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{args}"


# (reply from its first token, its call): what the model writes, forced from the reply's start
GRAMMAR_CASES = [
    *[(text, expected[0]) for text, _, _, expected in LLAMA_CPP if expected],
    (rendered(*EDIT), EDIT),
    (rendered("write", {"path": "a.py", "text": "x <|end|> y <|call|><|start|>"}),
     ("write", {"path": "a.py", "text": "x <|end|> y <|call|><|start|>"})),
    (model_call("special_function", '{"arg1": 1}'), CALL),
    (" to=functions.special_function<|channel|>commentary json<|message|>{\"arg1\": 1}", CALL),
    ("<|channel|>analysis<|message|>Need <|call|> and <|end| and <|start and to=functions.x here.<|end|>"
     "<|start|>assistant<|channel|>commentary<|message|>One moment.<|end|>"
     "<|start|>assistant" + model_call("special_function", '{"arg1": 1}'), CALL),
]


@pytest.mark.parametrize(("text", "expected"), GRAMMAR_CASES)
def test_grammar_holds_the_calls_the_model_writes(check: GrammarCheck, text: str, expected: object) -> None:
    """From the first token (tool_choice required): an analysis message and a preamble may come first, as the
    model begins; the call's header in either place and with any content type llama.cpp reads; and what the
    grammar let through is that call to the reader."""
    for parallel in (False, True):
        assert check.accepts(FMT.call_grammar(G_TOOLS, parallel), text)
    r = FMT.parse(text, CTX)
    assert calls(r) == [expected] and not r.broken and r.content in ("", "One moment.")


def test_grammar_holds_one_call_parallel_or_not(check: GrammarCheck) -> None:
    """`<|call|>` ends the turn (a stop token): a reply holds one call, so parallel changes nothing."""
    assert FMT.call_grammar(G_TOOLS, True) == FMT.call_grammar(G_TOOLS, False)
    two = model_call("special_function", '{"arg1": 1}') + "<|call|><|start|>assistant" + model_call(
        "special_function", '{"arg1": 2}')
    assert not check.accepts(FMT.call_grammar(G_TOOLS, True), two)


@pytest.mark.parametrize("text", [
    model_call("delete_all", '{"arg1": 1}'),  # a tool not offered
    model_call("special_function", "{}"),  # a required argument missing
    model_call("special_function", '{"arg1": "one"}'),  # the wrong type
    model_call("special_function", '{"arg1": 1.5}'),
    model_call("edit", '{"oldString": "a", "newString": 1}'),
    rendered("special_function", {"arg1": "1"}),
    model_call("special_function", "{arg1: 1}"),  # no JSON
    "<|channel|>final<|message|>No call.",  # no call at all
    "<|channel|>analysis<|message|>x<|call|><|start|>assistant" + model_call("special_function", '{"arg1": 1}'),
    "<|channel|>analysis<|message|>Done<|end|>",  # the reply may not end before its call
])
def test_grammar_refuses_what_the_tools_do_not_allow(check: GrammarCheck, text: str) -> None:
    assert not check.accepts(FMT.call_grammar(G_TOOLS, False), text)


def test_analysis_text_is_anything_the_reader_does_not_end(check: GrammarCheck) -> None:
    """The forced reply's reasoning may hold `<`, half-written markers and stop tokens as text; what would
    end it for the reader (`<|end|>`, or a stop token the next message follows) ends it for the grammar."""
    grammar = FMT.call_grammar(G_TOOLS, False)
    after = "<|end|><|start|>assistant" + model_call("special_function", '{"arg1": 1}')
    for thought in ("", "a < b", "<|", "<|end", "<|end|", "x<|call|>", "<|return|><|star", "<|call|> <|start|>",
                    "<<|e<|en<|end|", "to=functions.edit <|constrain|>json<|message|>{}"):
        text = "<|channel|>analysis<|message|>" + thought + after
        assert check.accepts(grammar, text), thought
        assert FMT.parse(text, CTX).reasoning == thought.strip()
    for bad in ("a<|end|>b", "a<|call|><|start|>b", "a<|return|><|start|>assistant b"):
        assert not check.accepts(grammar, "<|channel|>analysis<|message|>" + bad + after), bad


def test_lazy_grammar_holds_from_a_calls_header(check: GrammarCheck) -> None:
    """Under tool_choice auto the grammar waits for a call's header where a message starts: reasoning or an
    answer that mentions ` to=functions.` stays free (the call_start alone would have held it)."""
    grammar, triggers = FMT.call_grammar(G_TOOLS, False), FMT.triggers()
    thinking = "<|channel|>analysis<|message|>I could send it to=functions.edit later; <|constrain|>.<|end|>"
    call = "<|start|>assistant" + model_call("special_function", '{"arg1": 1}')
    answer = "<|start|>assistant<|channel|>final<|message|>Write `to=functions.x <|message|>{` to call."
    for text in (thinking + call, thinking + answer, "Hello", model_call("special_function", '{"arg1": 1}'),
                 rendered(*EDIT), thinking + "<|start|>assistant" + rendered(*EDIT)):
        assert check.accepts(grammar, text, triggers), text
    assert not check.accepts(grammar, thinking + answer, (re.escape(FMT.call_start),))
    assert not check.accepts(grammar, thinking + call.replace("special_function", "delete_all"), triggers)
    for first in (model_call("delete_all", "{}"), rendered("delete_all", {})):  # a header at the reply's start
        assert not check.accepts(grammar, first, triggers)
    assert not check.accepts(grammar, thinking + call + "<|end|>", triggers)  # the call ends the reply
    assert calls(FMT.parse(thinking + call, CTX)) == [CALL]


# enums: random weights would write a free string until max_tokens; a grammar cannot make them stop
E2E_TOOL = {"type": "function", "function": {"name": "read_file", "parameters": {
    "type": "object", "properties": {"path": {"enum": ["a.py", "b.py", "setup.cfg"]}, "whole": {"type": "boolean"}},
    "required": ["path", "whole"]}}}


def test_a_random_model_under_the_grammar_makes_a_call_that_validates(tmp_path: Path) -> None:
    """Served end to end on a tiny random-weight GGUF carrying the real template, tool_choice required, the
    grammar held from the reply's first token (after the prompt's `<|start|>assistant`). Random weights never
    write `<|end|>`, so an analysis message would run to max_tokens: with this seed the model writes the call
    at once."""
    r = one_call_under_grammar(tmp_path, "openai-gpt-oss-120b.jinja", E2E_TOOL, "gpt-oss")
    assert isinstance(r.renderer.picked.fmt, Harmony) and r.renderer.template is not None
    assert r.text.endswith("<|start|>assistant")
    assert not r.triggers

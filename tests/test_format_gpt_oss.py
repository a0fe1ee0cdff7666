"""gpt-oss's Harmony format (engine/conversation/formats/harmony.py).

The parse cases are llama.cpp's own, ported from tests/test-chat.cpp's "GPT-OSS format tests" (the
peg_tester of models/templates/openai-gpt-oss-120b.jinja, in the llama.cpp that swarmtune pins): the reply,
and the content, reasoning_content and tool_calls llama.cpp expects of it. Left out: the structured-output
case (a response_format grammar, not a reply format) and the continuation cases, which parse the prefilled
assistant message together with the reply. The rest are this format's own rules: where a reply may end,
what a stream must hold back, and what the prompt may leave open."""

import json

import pytest

from swarmtune.engine.conversation.formats.harmony import Harmony
from swarmtune.engine.conversation.formats.registry import pick
from swarmtune.engine.conversation.formats.reply import Reply, ReplyContext
from swarmtune.engine.conversation.formats.stream import ReplyStream
from tests.llama_templates import template

FMT = Harmony()
CTX = ReplyContext(prompt_tail="<|start|>assistant")
ASSIST = "Hello, world!\nWhat's up?"
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

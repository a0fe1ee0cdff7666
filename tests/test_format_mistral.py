"""Mistral's tool calls (engine/conversation/formats/mistral.py): `[TOOL_CALLS]name[ARGS]{...}` (v11 and
later, with or without `[CALL_ID]`), `[TOOL_CALLS][{"name", "arguments"}]` (v3), `[THINK]…[/THINK]` reasoning.

The parse cases are llama.cpp's own, ported from tests/test-chat.cpp (the peg_testers of
models/templates/mistralai-Ministral-3-14B-Reasoning-2512.jinja, Mistral-Small-3.2-24B-Instruct-2506.jinja,
unsloth-mistral-Devstral-Small-2507.jinja and mistralai-Mistral-Nemo-Instruct-2407.jinja, in the llama.cpp
that swarmtune pins): the reply, the tools offered, whether reasoning is split off (reasoning_format auto) and
the content, reasoning_content and tool_calls (with their ids, where the model wrote one) llama.cpp expects.
Left out: the continuation cases (they parse a prefilled assistant message with the reply) and the
response-format case (structured output, not calls). The rest are the format's own rules."""

import json
import re
from typing import Any

import pytest

from swarmtune.engine.conversation.formats.mistral import Mistral
from swarmtune.engine.conversation.formats.reply import Reply, ReplyContext
from swarmtune.engine.conversation.formats.stream import ReplyStream
from tests.chat_cases import ASSIST, SPECIAL, SPECIAL_OPT
from tests.llama_templates import template

MINISTRAL = "mistralai-Ministral-3-14B-Reasoning-2512.jinja"
SMALL = "Mistral-Small-3.2-24B-Instruct-2506.jinja"
DEVSTRAL = "unsloth-mistral-Devstral-Small-2507.jinja"
NEMO = "mistralai-Mistral-Nemo-Instruct-2407.jinja"




SPECIAL_CALL = ("special_function", {"arg1": 1})
OPT_CALL = ("special_function_with_opt", {"arg1": 1, "arg2": 2})


def calls(r: Reply) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, json.loads(c.arguments)) for c in r.calls]


def ctx(*tools: dict[str, Any], reasoning: bool = True) -> ReplyContext:
    return ReplyContext(prompt_tail="[/INST]", tools=tools, reasoning=reasoning)


# (template, reply, reasoning split off, tools, content, reasoning, calls, the calls' ids where llama.cpp has them)
LLAMA_CPP = [
    (MINISTRAL, ASSIST, False, (), ASSIST, "", [], []),
    (MINISTRAL, "[THINK]I'm\nthinking[/THINK]" + ASSIST, False, (), "[THINK]I'm\nthinking[/THINK]" + ASSIST, "", [],
     []),
    (MINISTRAL, "[THINK]I'm\nthinking[/THINK]" + ASSIST, True, (), ASSIST, "I'm\nthinking", [], []),
    (MINISTRAL, '[TOOL_CALLS]special_function[ARGS]{"arg1":1}', True, (SPECIAL,), "", "", [SPECIAL_CALL], []),
    (MINISTRAL, "[THINK]I'm\nthinking[/THINK]" + '[TOOL_CALLS]special_function[ARGS]{"arg1":1}', True, (SPECIAL,),
     "", "I'm\nthinking", [SPECIAL_CALL], []),
    (MINISTRAL, '[TOOL_CALLS]special_function[ARGS]{"arg1": 1}'
     '[TOOL_CALLS]special_function_with_opt[ARGS]{"arg1": 1, "arg2": 2}', True, (SPECIAL, SPECIAL_OPT), "", "",
     [SPECIAL_CALL, OPT_CALL], []),
    # a call marker inside the reasoning is its text
    (MINISTRAL, '[THINK]Let me think about [TOOL_CALLS]special_function[ARGS]{"arg1":1} and more[/THINK]'
     '[TOOL_CALLS]special_function[ARGS]{"arg1": 1}', True, (SPECIAL,), "",
     'Let me think about [TOOL_CALLS]special_function[ARGS]{"arg1":1} and more', [SPECIAL_CALL], []),
    (SMALL, ASSIST, False, (), ASSIST, "", [], []),
    (SMALL, '[TOOL_CALLS]special_function[CALL_ID]123456789[ARGS]{"arg1": 1}', False, (SPECIAL,), "", "",
     [SPECIAL_CALL], ["123456789"]),
    (SMALL, '[TOOL_CALLS]special_function[CALL_ID]000000001[ARGS]{"arg1": 1}'
     '[TOOL_CALLS]special_function_with_opt[CALL_ID]000000002[ARGS]{"arg1": 1, "arg2": 2}', False,
     (SPECIAL, SPECIAL_OPT), "", "", [SPECIAL_CALL, OPT_CALL], ["000000001", "000000002"]),
    (DEVSTRAL, ASSIST, False, (), ASSIST, "", [], []),
    (DEVSTRAL, '[TOOL_CALLS]special_function[ARGS]{"arg1": 1}', False, (SPECIAL,), "", "", [SPECIAL_CALL], []),
    (DEVSTRAL, ASSIST + '[TOOL_CALLS]special_function[ARGS]{"arg1": 1}', False, (SPECIAL,), ASSIST, "",
     [SPECIAL_CALL], []),
    (NEMO, ASSIST, False, (), ASSIST, "", [], []),
    (NEMO, '[TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": 1}, "id": "123456789"}]', False,
     (SPECIAL,), "", "", [SPECIAL_CALL], ["123456789"]),
]


def fmt_for(name: str) -> Mistral:
    fmt = Mistral.for_template(template(name))
    assert fmt is not None
    return fmt


@pytest.mark.parametrize(("name", "text", "split", "tools", "content", "reasoning", "expected", "ids"), LLAMA_CPP)
def test_llama_cpp_cases(name: str, text: str, split: bool, tools: tuple[dict[str, Any], ...], content: str,
                         reasoning: str, expected: list[object], ids: list[str]) -> None:
    r = fmt_for(name).parse(text, ctx(*tools, reasoning=split))
    assert (r.content, r.reasoning, calls(r)) == (content, reasoning, expected)
    if ids:
        assert [c.id for c in r.calls] == ids
    assert not r.broken


def test_templates_pick_mistral() -> None:
    from swarmtune.engine.conversation.formats.registry import pick
    for name in (MINISTRAL, SMALL, DEVSTRAL, NEMO):
        assert pick(template(name)).fmt.name == "mistral"
    assert [fmt_for(n).text_think for n in (MINISTRAL, SMALL)] == [True, False]
    for other in ("meta-llama-Llama-3.3-70B-Instruct.jinja", "Qwen-Qwen3-0.6B.jinja", "Kimi-K2-Instruct.jinja"):
        assert Mistral.for_template(template(other)) is None


def test_ids_the_templates_take_back() -> None:
    """Mistral's templates refuse an id that is not 9 letters or digits: a call without one gets one so."""
    r = fmt_for(SMALL).parse('[TOOL_CALLS]special_function[ARGS]{"arg1": 1}', ctx(SPECIAL))
    assert re.fullmatch(r"[0-9a-zA-Z]{9}", r.calls[0].id)


def test_v3_arrays_in_any_key_order() -> None:
    text = ('Hello[TOOL_CALLS] [{"arguments": {"name": "John"}, "name": "get_age"}, '
            '{"name": "add", "arguments": {"a": 3.5, "b": 4}}]')
    r = fmt_for(NEMO).parse(text, ctx())
    assert (r.content, calls(r)) == ("Hello", [("get_age", {"name": "John"}), ("add", {"a": 3.5, "b": 4})])


def test_plain_think_tags_of_magistral_2506() -> None:
    r = fmt_for(MINISTRAL).parse("<think>r</think>c", ctx())
    assert (r.reasoning, r.content) == ("r", "c")
    assert fmt_for(SMALL).parse("<think>r</think>c", ctx()).content == "<think>r</think>c"
    unclosed = fmt_for(MINISTRAL).parse("[THINK]cut short by max_tokens", ctx())
    assert (unclosed.reasoning, unclosed.content) == ("cut short by max_tokens", "")


def test_markers_inside_the_arguments_are_their_text() -> None:
    value = 'Calls look like [TOOL_CALLS]name[ARGS]{"a": 1}; thinking is [THINK]...[/THINK]. }{ ]['
    r = fmt_for(MINISTRAL).parse("[TOOL_CALLS]write[ARGS]" + json.dumps({"content": value}), ctx())
    assert calls(r) == [("write", {"content": value})]


def test_what_is_no_call_stays_content() -> None:
    for text in ("[TOOL_CALLS] not json at all", "[TOOL_CALLS]f[ARGS]not json", '[TOOL_CALLS][{"x": 1}]'):
        r = fmt_for(SMALL).parse(text, ctx())
        assert (r.content, r.calls) == (text, ()), text
        assert r.broken


def test_a_call_cut_short_is_dropped_and_said() -> None:
    call = '[TOOL_CALLS]write_file[CALL_ID]abcdefghi[ARGS]{"path": "/tmp/build.sh", "content": "rm -rf /"}'
    for n in range(len("[TOOL_CALLS]"), len(call)):
        r = fmt_for(SMALL).parse("Let me check." + call[:n], ctx())
        assert (r.content, r.calls) == ("Let me check.", ()), call[:n]
        assert r.broken
    held = fmt_for(SMALL).parse("Let me check." + call[:40], ctx(), final=False)
    assert (held.content, held.calls, held.broken) == ("Let me check.", (), "")


STREAMED = [
    (MINISTRAL, "[THINK]Plan: [TOOL_CALLS]x[/THINK]On it.[TOOL_CALLS]special_function[ARGS]{\"arg1\": 1}"
     "[TOOL_CALLS]special_function_with_opt[ARGS]{\"arg1\": 1, \"arg2\": 2}"),
    (SMALL, 'Sure [TOOL_CALLS]special_function[CALL_ID]123456789[ARGS]{"arg1": 1} and then some'),
    (SMALL, '[TOOL_CALLS]bad name[ARGS]{}[TOOL_CALLS]special_function[ARGS]{"arg1": 1}'),
    (NEMO, 'Hello[TOOL_CALLS] [{"name": "special_function", "arguments": {"arg1": 1}}]'),
    (MINISTRAL, "<think>plain tags</think>Answer [with brackets] and [TOOL"),
    (DEVSTRAL, '[TOOL_CALLS]write_file[ARGS]{"path": "/tmp/build.sh", "content": "rm -rf /'),
]


@pytest.mark.parametrize(("name", "text"), STREAMED)
def test_streamed_one_character_at_a_time_equals_the_whole(name: str, text: str) -> None:
    fmt, context = fmt_for(name), ctx(SPECIAL, SPECIAL_OPT)
    whole = fmt.parse(text, context)
    stream = ReplyStream(fmt, context)
    for ch in text:
        stream.feed(ch)
    stream.finish()
    got = stream.result()
    assert (got.content, got.reasoning, calls(got), got.broken) == (whole.content, whole.reasoning, calls(whole),
                                                                   whole.broken)

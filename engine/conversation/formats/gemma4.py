"""Gemma 4: a call is `<|tool_call>call:NAME{...}<tool_call|>`, its arguments in Gemma's object notation
rather than JSON: keys bare, strings between `<|"|>` quotes (nothing escaped inside), numbers, true, false
and null as JSON writes them, objects and arrays nested freely:

    <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3,opts:{units:<|"|>metric<|"|>}}<tool_call|>

Reasoning is the thought channel, `<|channel>thought\\n…<channel|>`, before the content or the calls. With
thinking off the template writes an empty one, `<|channel>thought\\n<channel|>`, into the prompt itself and the
reply is content from its first character; with `enable_thinking` the prompt ends at `<|turn>model\\n` and the
model opens the channel. Text before, between and after the calls is content. A `<|channel>` that opens no
thought and a `<channel|>` that closes none are dropped, as llama.cpp drops them.

Sources: the official template (google/gemma-4-31B-it's chat_template.jinja: format_argument, the generation
prompt), the canitoolcall gemma4 fixtures' notes, and llama.cpp's grammar for it (common/parsers/gemma4.cpp,
common/chat-peg-parser.cpp's gemma4_to_json, tests/test-chat.cpp)."""

import re
from typing import Any

from swarmtune.engine.conversation.formats.base import Format, dumps
from swarmtune.engine.conversation.formats.reply import Reply, ReplyContext, ToolCall, new_call_id

CALL_OPEN, CALL_CLOSE, QUOTE = "<|tool_call>", "<tool_call|>", '<|"|>'
CHANNEL_OPEN, CHANNEL_CLOSE, THOUGHT = "<|channel>", "<channel|>", "thought"
PREFIX = "call:"
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_NUMBERISH = re.compile(r"-?\d*(?:\.\d*)?(?:[eE][+-]?\d*)?")  # a number, or what may grow into one
_WORDS = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}


class _Cut(Exception):
    """The text ends inside the value: the model may still be writing it."""


class _Bad(Exception):
    """The value is not Gemma's object notation."""


class Gemma4(Format):
    name = "gemma4"
    markers = (CALL_OPEN, CALL_CLOSE, CHANNEL_OPEN, CHANNEL_CLOSE)
    call_start = CALL_OPEN
    think_open = CHANNEL_OPEN + THOUGHT
    think_close = CHANNEL_CLOSE

    @classmethod
    def for_template(cls, source: str) -> "Gemma4 | None":
        return cls() if CALL_OPEN + PREFIX in source and CHANNEL_OPEN in source else None

    def parse(self, text: str, ctx: ReplyContext, final: bool = True) -> Reply:
        content: list[str] = []
        reasoning: list[str] = []
        calls: list[ToolCall] = []
        broken = ""
        pos: int | None = 0
        if self.starts_in_reasoning(ctx):  # the prompt opened the thought channel (a continued reply)
            pos = self._thought(text, 0, ctx, final, reasoning, content, raw_open="")
        while pos is not None and pos < len(text):
            at = _first(text, pos, (CALL_OPEN, CHANNEL_OPEN, CHANNEL_CLOSE))
            if at is None:
                content.append(text[pos:])
                break
            content.append(text[pos:at])
            if text.startswith(CHANNEL_CLOSE, at):  # closes no thought: dropped
                pos = at + len(CHANNEL_CLOSE)
            elif text.startswith(CHANNEL_OPEN, at):
                after = at + len(CHANNEL_OPEN)
                rest = text[after : after + len(THOUGHT)]
                if rest == THOUGHT:
                    pos = self._thought(text, after + len(THOUGHT), ctx, final, reasoning, content,
                                        raw_open=CHANNEL_OPEN + THOUGHT)
                elif not final and THOUGHT.startswith(rest):
                    break  # perhaps the thought channel, half-written
                else:
                    pos = after  # a channel that opens no thought: dropped
            else:
                pos, call, why = _call(text, at, final)
                if call is not None:
                    calls.append(call)
                elif why:
                    broken = broken or why
                    if pos is not None:  # closed but malformed: it stays content, as the model wrote it
                        content.append(text[at:pos])
        out = "".join(content)
        return Reply(out if out.strip() else "", "".join(reasoning).strip(), tuple(calls), broken)

    @staticmethod
    def _thought(text: str, pos: int, ctx: ReplyContext, final: bool, reasoning: list[str], content: list[str],
                 raw_open: str) -> int | None:
        """Reads a thought channel's body from `pos`; where the reply goes on after it (None: at its end)."""
        end = text.find(CHANNEL_CLOSE, pos)
        stop = len(text) if end < 0 else end
        if ctx.reasoning:
            reasoning.append(text[pos:stop].lstrip())  # the whitespace after `thought` only separates it
        else:  # --reasoning-format none: the channel stays content, markers and all
            content.append(raw_open + text[pos:stop] + ("" if end < 0 else CHANNEL_CLOSE))
        return None if end < 0 else end + len(CHANNEL_CLOSE)


def _first(text: str, pos: int, markers: tuple[str, ...]) -> int | None:
    found = [at for at in (text.find(m, pos) for m in markers) if at >= 0]
    return min(found) if found else None


def _call(text: str, at: int, final: bool) -> tuple[int | None, ToolCall | None, str]:
    """(where the reply goes on, the call, why it is none) for the `<|tool_call>` at `at`. The reply goes
    on nowhere (None) where the call is still open: it is neither a call nor content yet."""
    pos = at + len(CALL_OPEN)
    try:
        pos = _expect(text, pos, PREFIX)
        name_end = pos
        while name_end < len(text) and not text[name_end].isspace() and text[name_end] not in "{<":
            name_end += 1
        name = text[pos:name_end]
        if name_end == len(text):
            raise _Cut
        if not name:
            raise _Bad
        args, pos = _object(text, _expect(text, name_end, "{"))
        pos = _space(text, pos)
        if pos == len(text) and final:
            return pos, ToolCall(name, dumps(args), new_call_id()), ""  # the closer was the stop token
        pos = _expect(text, pos, CALL_CLOSE)
        return pos, ToolCall(name, dumps(args), new_call_id()), ""
    except _Cut:
        return None, None, "the reply ended inside a call (max_tokens?)" if final else ""
    except (_Bad, RecursionError):  # not the notation, or nested deeper than Python recurses
        end = text.find(CALL_CLOSE, at)
        if end < 0:  # no end to it yet: what it is may still change
            return None, None, f"a {CALL_OPEN} that is not a call: {text[at:at + 80]!r}" if final else ""
        return end + len(CALL_CLOSE), None, f"a {CALL_OPEN} that is not a call: {text[at:end][:80]!r}"


def _expect(text: str, pos: int, literal: str) -> int:
    if text.startswith(literal, pos):
        return pos + len(literal)
    if literal.startswith(text[pos : pos + len(literal)]):
        raise _Cut  # the rest of text is a prefix of the literal
    raise _Bad


def _space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _value(text: str, pos: int) -> tuple[Any, int]:
    pos = _space(text, pos)
    if pos >= len(text):
        raise _Cut
    if text.startswith("{", pos):
        return _object(text, pos + 1)
    if text.startswith("[", pos):
        return _array(text, pos + 1)
    if QUOTE.startswith(text[pos : pos + len(QUOTE)]):
        return _string(text, pos)
    m = _NUMBERISH.match(text, pos)
    end = m.end() if m else pos
    if end > pos:
        if end == len(text):
            raise _Cut  # more digits may follow
        number = text[pos:end]
        if not _NUMBER.fullmatch(number):
            raise _Bad
        return (float(number) if any(c in number for c in ".eE") else int(number)), end
    for word, value in _WORDS.items():
        if text.startswith(word, pos):
            if pos + len(word) == len(text):
                raise _Cut
            return value, pos + len(word)
        if len(text) - pos < len(word) and word.startswith(text[pos:]):
            raise _Cut
    raise _Bad


def _string(text: str, pos: int) -> tuple[str, int]:
    pos = _expect(text, pos, QUOTE)
    end = text.find(QUOTE, pos)
    if end < 0:
        raise _Cut
    return text[pos:end], end + len(QUOTE)


def _object(text: str, pos: int) -> tuple[dict[str, Any], int]:
    """The members of an object whose `{` ends before `pos`, and where the object ends."""
    out: dict[str, Any] = {}
    pos = _space(text, pos)
    if text.startswith("}", pos):
        return out, pos + 1
    while True:
        pos = _space(text, pos)
        if text.startswith(QUOTE, pos):  # a key written quoted, as the template writes a declaration's
            key, pos = _string(text, pos)
        else:
            colon = pos
            while colon < len(text) and text[colon] not in ":}":
                colon += 1
            if colon == len(text):
                raise _Cut
            key = text[pos:colon].strip()
            if not key and text[colon] == "}" and out:  # a trailing comma
                return out, colon + 1
            if not key or text[colon] == "}":
                raise _Bad
            pos = colon
        pos = _expect(text, _space(text, pos), ":")
        out[key], pos = _value(text, pos)
        pos = _space(text, pos)
        if pos >= len(text):
            raise _Cut
        if text[pos] == "}":
            return out, pos + 1
        pos = _expect(text, pos, ",")


def _array(text: str, pos: int) -> tuple[list[Any], int]:
    """The items of an array whose `[` ends before `pos`, and where the array ends."""
    out: list[Any] = []
    pos = _space(text, pos)
    if text.startswith("]", pos):
        return out, pos + 1
    while True:
        item, pos = _value(text, pos)
        out.append(item)
        pos = _space(text, pos)
        if pos >= len(text):
            raise _Cut
        if text[pos] == "]":
            return out, pos + 1
        pos = _expect(text, pos, ",")

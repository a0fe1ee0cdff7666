"""gpt-oss: OpenAI's Harmony response format. A reply is a run of messages, each a header and a body:

    <|channel|>analysis<|message|>Need the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}

(the first message's `<|start|>assistant` is the prompt's; the `<|call|>`/`<|return|>` that ends the turn is a
stop token and is not in the reply). The channel says what a message is: `analysis` is reasoning, `final` is
content, `commentary` without a recipient is a preamble the user sees (content). A recipient `to=functions.NAME`
makes the message a call whose body is its JSON arguments; the recipient may sit in the role part of the header
(` to=functions.NAME<|channel|>commentary`, as the chat template renders a past call) or after the channel
(`<|channel|>commentary to=functions.NAME`, as the model generates it), and the content type may be written
`<|constrain|>json`, ` json` or not at all. A recipient outside `functions.` (the built-in `python`,
`browser.*`, `container.*`) is a tool nobody offered: its message is dropped, as llama.cpp drops it.

Sources: the Harmony spec (openai/harmony docs/format.md), the canitoolcall gpt-oss fixtures' notes, and
llama.cpp's reading of it (common/parsers/gpt-oss.cpp, tests/test-chat.cpp).

We do not use `openai-harmony`, OpenAI's own parser: it reads token ids of the o200k_base encoding, which it
downloads at run time unless TIKTOKEN_ENCODINGS_BASE points at a local copy, and swarmtune runs offline on the
text the server has already decoded. So this reads the text: a marker inside a JSON argument string is skipped
by decoding the JSON, and one inside reasoning text is text unless it is `<|end|>` (the only way a text
message ends) or a stop token followed by the next message's `<|start|>`."""

import json
import re
from typing import Any

from swarmtune.engine.conversation.formats.base import Format, dumps
from swarmtune.engine.conversation.formats.grammar import literal, schema_rules, text_without, tool_parts
from swarmtune.engine.conversation.formats.reply import Reply, ReplyContext, ToolCall, new_call_id

START, END, MESSAGE = "<|start|>", "<|end|>", "<|message|>"
CHANNEL, CONSTRAIN, CALL, RETURN = "<|channel|>", "<|constrain|>", "<|call|>", "<|return|>"
FUNCTIONS = "functions."
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL_NAME = re.compile(r"\s*([^\s<]*)")


def _reject(constant: str) -> None:
    raise ValueError(f"{constant} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject)  # NaN and Infinity are no JSON
_HEADS = (CHANNEL, MESSAGE, CONSTRAIN, "to=")  # what a header begins with, after the role


class Harmony(Format):
    name = "gpt-oss"
    markers = (START, END, MESSAGE, CHANNEL, CONSTRAIN, CALL, RETURN)
    call_start = " to=" + FUNCTIONS  # in both places a recipient is written (triggers: only in a header)
    think_open = ""  # reasoning is a channel, never a block the prompt leaves open
    think_close = ""

    @classmethod
    def for_template(cls, source: str) -> "Harmony | None":
        return cls() if CHANNEL in source and MESSAGE in source else None

    def call_grammar(self, tools: list[dict[str, Any]], parallel: bool) -> str:
        """A call message's header and its JSON arguments: `<|channel|>commentary to=functions.NAME
        <|constrain|>json<|message|>{...}` as the model writes it, or the recipient in the role part,
        ` to=functions.NAME<|channel|>commentary json<|message|>{...}`, as the template renders a past call
        (the channel commentary or analysis, the content type ` <|constrain|>json`, ` json` or none: every
        header llama.cpp reads). It ends with the arguments: the `<|call|>` after them is a stop token, so
        a reply holds one call, parallel or not.

        From the first token (tool_choice required or named) the reply may first be what the model begins
        with after `<|start|>assistant`: an analysis message (its reasoning), then a preamble on commentary,
        each closed by `<|end|><|start|>assistant`; their text is anything the reader does not end there.
        Lazily the grammar starts at a call's header (triggers), past them."""
        rules, in_channel, in_role = [], [], []
        for i, (name, params) in enumerate(tool_parts(tools)):
            body, args = schema_rules(params, f"args{i}")
            rules.append(body)
            in_channel.append(f"{literal(name)} content-type {literal(MESSAGE)} {args}")
            in_role.append(f"{literal(name)} channel content-type {literal(MESSAGE)} {args}")
        message = f"{literal(END + START)} \"assistant\""
        return "\n".join([
            *rules,
            # the reader ends a text message at <|end|>, or at a stop token that the next message follows
            text_without("text", [END, CALL + START, RETURN + START], then=END),
            f"analysis ::= {literal(CHANNEL + 'analysis' + MESSAGE)} text {message}",
            f"preamble ::= {literal(CHANNEL + 'commentary' + MESSAGE)} text {message}",
            f"channel ::= {literal(CHANNEL)} (\"commentary\" | \"analysis\")",
            f"content-type ::= ({literal(' ' + CONSTRAIN + 'json')} | \" json\")?",
            f"recipient ::= {literal(' to=' + FUNCTIONS)}",
            "call ::= channel recipient (" + " | ".join(in_channel) + ") | recipient (" + " | ".join(in_role) + ")",
            "root ::= analysis? preamble? call",
        ]) + "\n"

    def triggers(self) -> tuple[str, ...]:
        """A call's header where a message starts (the reply's start, or after `<|start|>assistant`), the
        grammar held from the header's start: ` to=functions.` alone would also match inside reasoning that
        mentions it, and hold what follows to a call."""
        return (r"(?:^|<\|start\|>assistant)((?:<\|channel\|>(?:commentary|analysis))? to=functions\.)",)

    def parse_without_calls(self, text: str, ctx: ReplyContext, final: bool = True) -> Reply:
        # its reasoning and its answer are messages of their own, not a block before the rest: read them as
        # ever, and leave out what the model addressed to a tool no request offered
        r = self.parse(text, ctx, final)
        return Reply(r.content, r.reasoning)

    def parse(self, text: str, ctx: ReplyContext, final: bool = True) -> Reply:
        opened = _opened(ctx.prompt_tail)
        return _Reader(opened + text, len(opened), ctx, final).read()

    def starts_in_reasoning(self, ctx: ReplyContext) -> bool:
        """The prompt left an analysis message open (a continued reply); a plain `<|start|>assistant` does not."""
        opened = _opened(ctx.prompt_tail)
        return opened.endswith(MESSAGE) and _channel(opened[: -len(MESSAGE)]) == "analysis" \
            and not _recipient(opened)


class _Reader:
    """One pass over a reply, message by message; `stop` ends it where the text so far cannot say more."""

    def __init__(self, text: str, skip: int, ctx: ReplyContext, final: bool) -> None:
        self.text, self.skip, self.ctx, self.final = text, skip, ctx, final  # text[:skip] is the prompt's
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[ToolCall] = []
        self.broken = ""

    def read(self) -> Reply:
        pos: int | None = 0
        first = True
        while pos is not None and (first or pos < len(self.text)):
            pos = self._message(pos, first)
            first = False
        content, reasoning = "".join(self.content), "".join(self.reasoning)
        return Reply(content if content.strip() else "", reasoning if reasoning.strip() else "",
                     tuple(self.calls), self.broken)

    def _message(self, pos: int, first: bool) -> int | None:
        """Reads the message at `pos`; where the next one starts, or None where the reading stops."""
        text = self.text
        if not first:
            while pos < len(text) and text[pos].isspace():
                pos += 1
            if text.startswith(START, pos):
                pos += len(START)
                pos = _role_end(text, pos)
            elif pos >= len(text) or (not self.final and START.startswith(text[pos:])):
                return None
        lead = pos
        while lead < len(text) and text[lead].isspace():
            lead += 1
        if not text.startswith(_HEADS, lead):
            if not self.final and len(text) - lead < len(CONSTRAIN) and any(h.startswith(text[lead:]) for h in _HEADS):
                return None  # perhaps a header, not yet written far enough to tell
            return self._plain(pos)
        found = _first(text, pos, (MESSAGE, START, END))
        if found is None:  # the header is still being written, or the reply ended inside it
            if self.final and _recipient(text[pos:]).startswith(FUNCTIONS):
                self.broken = self.broken or "the reply ended inside a call's header (max_tokens?)"
            return None
        at, marker = found
        if marker != MESSAGE:  # a header the model garbled (`<|channel|>??<|end|>`): skip it
            return at + len(END) if marker == END else at
        header, body = text[pos:at], at + len(MESSAGE)
        recipient = _recipient(header)
        if recipient.startswith(FUNCTIONS):
            return self._call(pos, recipient[len(FUNCTIONS):], body)
        stop, after = self._body_end(body)
        if recipient:  # a built-in tool nobody offered: not a function call, and not for the user
            return after
        if _channel(header) == "analysis" and self.ctx.reasoning:
            self.reasoning.append(text[body:stop])
        elif _channel(header) == "analysis":  # --reasoning-format none: the message stays content, header and all
            self.content.append(text[max(pos, self.skip) : stop] + (END if text.startswith(END, stop) else ""))
        else:  # final, a preamble on commentary, or a channel out of the spec: the user reads it
            self.content.append(text[body:stop])
        return after

    def _plain(self, pos: int) -> int | None:
        """Text that is no Harmony message (no header): content, up to the next message."""
        found = _first(self.text, pos, (START, END))
        stop = found[0] if found else len(self.text)
        self.content.append(self.text[pos:stop])
        if found is None:
            return None
        return stop + len(END) if found[1] == END else stop

    def _call(self, pos: int, name: str, body: int) -> int | None:
        text = self.text
        start = body
        while start < len(text) and text[start].isspace():
            start += 1
        try:
            args, stop = _DECODER.raw_decode(text, start)
        except (ValueError, RecursionError):
            args, stop = None, -1
        if isinstance(args, dict) and name:
            self.calls.append(ToolCall(name, dumps(args), new_call_id()))
            while stop < len(text) and text[stop].isspace():
                stop += 1
            for marker in (CALL, END, RETURN):
                if text.startswith(marker, stop):
                    return stop + len(marker)
            return stop
        if not self.final:
            return None  # the arguments are still being written (or are not JSON: the whole reply will say)
        stop, after = self._body_end(body)
        if stop == len(text):
            self.broken = self.broken or f"the reply ended inside a call to {name!r} (max_tokens?)"
            return None
        bad = text[start:stop][:80]
        self.broken = self.broken or f"a call to {name!r} whose arguments are not a JSON object: {bad!r}"
        self.content.append(text[max(pos, self.skip) : stop])  # as the model wrote it
        return after

    def _body_end(self, body: int) -> tuple[int, int | None]:
        """(where a text body ends, where the next message starts: None where the reading stops there).
        `<|end|>` always ends a body; a stop token only before `<|start|>` or at the reply's end, as the model
        may write `<|call|>` as text inside its reasoning. A stop token at the end of a reply that may go on
        is neither yet."""
        text, pos = self.text, body
        while True:
            found = _first(text, pos, (END, CALL, RETURN))
            if found is None:
                return len(text), None
            at, marker = found
            after = at + len(marker)
            rest = text[after:]
            if marker == END or rest.startswith(START):
                return at, after
            if not rest and self.final:
                return at, None
            if not self.final and START.startswith(rest):
                return at, None
            pos = after


def _first(text: str, pos: int, markers: tuple[str, ...]) -> tuple[int, str] | None:
    """The first of `markers` in `text` from `pos`, and which it is."""
    best: tuple[int, str] | None = None
    for m in markers:
        at = text.find(m, pos)
        if at >= 0 and (best is None or at < best[0]):
            best = (at, m)
    return best


def _split_header(header: str) -> tuple[str, str]:
    """(the role part, the last channel part) of a header: gpt-oss sometimes writes a stray
    `<|channel|>commentary to=assistant` before the real channel, and only the last one counts."""
    parts = header.split(CHANNEL)
    return parts[0], parts[-1] if len(parts) > 1 else ""


def _recipient(header: str) -> str:
    role, channel = _split_header(header)
    for part in (channel, role):
        m = _RECIPIENT.search(part)
        if m:
            return m.group(1)
    return ""


def _channel(header: str) -> str:
    m = _CHANNEL_NAME.match(_split_header(header)[1])
    return m.group(1) if m else ""


def _opened(prompt_tail: str) -> str:
    """The header the prompt has begun for the reply's first message, up to its `<|message|>` where it has
    one (a continued reply: what the prompt wrote of the body is the prompt's, not the reply's); "" for the
    plain `<|start|>assistant` of a generation prompt."""
    at = prompt_tail.rfind(START)
    if at < 0:
        return ""
    rest = prompt_tail[at + len(START) :]
    rest = rest[_role_end(rest, 0) :]
    if _first(rest, 0, (END, CALL, RETURN)) is not None:
        return ""  # the prompt's last message is closed: the reply is a new one
    message = rest.find(MESSAGE)
    return rest if message < 0 else rest[: message + len(MESSAGE)]


def _role_end(text: str, pos: int) -> int:
    """Past the role a `<|start|>` names (`assistant`), which runs to a space or a marker."""
    while pos < len(text) and not text[pos].isspace() and text[pos] != "<":
        pos += 1
    return pos

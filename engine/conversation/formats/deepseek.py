"""DeepSeek: five sub-formats of one family, each after an optional `<think>…</think>`, told apart by the
template (DeepSeek.for_template); the instance keeps which one (`variant`).

- v3 (V3, V3-0324, R1 and its distills): a block of calls, each a typed header and a fenced JSON object:
      <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
      ```json
      {"city": "Paris"}
      ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
- v31 (V3.1): the same block, the name before the separator and bare JSON after it (one line, wrapped here):
      <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>
      <｜tool▁calls▁end｜>
- v32, v4, v41 (V3.2, V4, V4.1): DSML, XML-ish with typed parameters (deepseek_dsml.py has its rules).

Where the formats come from: the chat templates llama.cpp vendors (models/templates/llama-cpp-deepseek-r1.jinja,
deepseek-ai-DeepSeek-R1-Distill-*.jinja, -V3.1, -V3.2, -V4, -V4-Flash-0731), which write past calls so, and
llama.cpp's parsers of them (common/chat.cpp's autoparser for V3/V3.1, common/parsers/deepseek.cpp for DSML),
DeepSeek's own encoders (encoding/*.py of V3.2 and later) and vLLM's and SGLang's DeepSeek tool parsers.

A block's calls go out one by one as each closes. A call that closes but does not parse stays content, as
the model wrote it; where it is the block's first, the block's markers stay with it (content passthrough)."""

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from swarmtune.engine.conversation.formats.base import Format, dumps
from swarmtune.engine.conversation.formats.deepseek_dsml import (
    DSML_OPEN,
    DSML_OPENERS,
    Piece,
    dsml_grammar,
    dsml_piece,
    partial_of,
)
from swarmtune.engine.conversation.formats.grammar import literal, schema_rules, tool_parts
from swarmtune.engine.conversation.formats.reply import Reply, ReplyContext, ToolCall, new_call_id

Variant = Literal["v3", "v31", "v32", "v4", "v41"]

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

_CALLS_BEGIN = re.compile(re.escape(CALLS_BEGIN))
_CALL_START = {"v3": CALLS_BEGIN, "v31": CALLS_BEGIN, "v32": DSML_OPENERS[0], "v4": DSML_OPENERS[1],
               "v41": DSML_OPENERS[2]}
# V4.1's encoder writes a space after the DSML token; a template that does so is V4.1's
_SPACED_DSML = re.compile(r"(?:｜DSML｜|dsml_token\s*\+\s*')\s+calls")
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class DeepSeek(Format):
    variant: Variant = "v3"

    name = "deepseek"
    # block openers and the thinking tags: a stream holds each back until it is whole, or is not one
    markers = (CALLS_BEGIN, *DSML_OPENERS, THINK_OPEN, THINK_CLOSE)

    @property
    def call_start(self) -> str:  # type: ignore[override]  # the base's ClassVar; here it follows the variant
        return _CALL_START[self.variant]

    @property
    def dsml(self) -> bool:
        return self.variant in ("v32", "v4", "v41")

    def call_grammar(self, tools: list[dict[str, Any]], parallel: bool) -> str:
        """The block the variant's template renders a past call in, of one call (or, parallel, one or more):
        V3's `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```<｜tool▁call▁end｜>`, V3.1's
        `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>` between the block's markers; DSML's
        block for the rest (deepseek_dsml.dsml_grammar)."""
        if self.dsml:
            block = {"v32": "function_calls", "v4": "tool_calls", "v41": "calls"}[self.variant]
            return dsml_grammar(tools, parallel, block, spaced=self.variant == "v41")
        rules, calls = [], []
        for i, (name, params) in enumerate(tool_parts(tools)):
            # strict JSON: the block's parser reads the arguments with json's strict decoder
            body, args = schema_rules(params, f"args{i}")
            rules.append(body)
            if self.variant == "v3":  # the fence's newlines as the template writes them, or as R1 leaves them out
                head = literal(f"{CALL_BEGIN}function{SEP}{name}\n```json\n")
                calls.append(f'{head} {args} "\\n"? "```" "\\n"? {literal(CALL_END)}')
            else:
                calls.append(f"{literal(CALL_BEGIN + name + SEP)} {args} {literal(CALL_END)}")
        rules.append("call ::= " + " | ".join(calls))
        more = ' ("\\n"? call)*' if parallel else ""  # V3's template puts a newline between calls
        rules.append(f"root ::= {literal(CALLS_BEGIN)} call{more} {literal(CALLS_END)}")
        return "\n".join(rules) + "\n"

    @classmethod
    def for_template(cls, source: str) -> "DeepSeek | None":
        # as llama.cpp's common/chat.cpp tells a DSML template: it names the DSML token and a calls block
        if "dsml_token" in source and "DSML" in source:
            if "function_calls" in source:
                return cls("v32")
            if _SPACED_DSML.search(source):
                return cls("v41")
            return cls("v4") if "tool_calls" in source else None
        if CALLS_BEGIN in source and SEP in source:
            # V3 and R1 fence each call's arguments as ```json; V3.1 writes them bare after the name
            return cls("v3") if "```json" in source else cls("v31")
        return None

    def parse(self, text: str, ctx: ReplyContext, final: bool = True) -> Reply:
        reasoning, rest = self._split_reasoning(text, ctx, final)
        opener = DSML_OPEN if self.dsml else _CALLS_BEGIN
        content: list[str] = []
        calls: list[ToolCall] = []
        broken, pos = "", 0
        while True:
            m = opener.search(rest, pos)
            if m is None:
                content.append(rest[pos:])
                break
            # the whitespace before a block (DSML's "\n\n" separator) belongs to the block
            lead = pos + len(rest[pos : m.start()].rstrip())
            content.append(rest[pos:lead])
            end, why = self._block(rest, lead, m.end(), ctx, final, content, calls)
            broken = broken or why
            if end is None:
                break
            pos = end
        out = "".join(content)
        return Reply(out if out.strip() else "", reasoning, tuple(calls), broken)

    def _split_reasoning(self, text: str, ctx: ReplyContext, final: bool) -> tuple[str, str]:
        """(reasoning, the rest). A DSML block ends the reasoning as `</think>` does (llama.cpp's
        thinking_end_tags for V3.2/V4: a model may open its calls without closing its thinking)."""
        if not ctx.reasoning:
            return "", text
        body = text
        if not self.starts_in_reasoning(ctx):
            stripped = text.lstrip()
            if not stripped.startswith(THINK_OPEN):
                if stripped and THINK_OPEN.startswith(stripped) and not final:
                    return "", ""  # maybe the block's opener, half-written
                return "", text
            body = stripped[len(THINK_OPEN):]
        end = body.find(THINK_CLOSE)
        if self.dsml:
            m = DSML_OPEN.search(body, 0, end if end >= 0 else len(body))
            if m is not None:
                return body[: m.start()].strip(), body[m.start():]
        if end < 0:
            return body.strip(), ""
        return body[:end].strip(), body[end + len(THINK_CLOSE):].lstrip()

    def _block(self, text: str, lead: int, body: int, ctx: ReplyContext, final: bool, content: list[str],
               calls: list[ToolCall]) -> tuple[int | None, str]:
        """Reads the block whose opener ends at `body` (its leading whitespace starts at `lead`): its calls go
        to `calls`, what of it stays text to `content`. Returns where the block ends (None: the text ends
        inside it) and why a call of it broke."""
        passthrough: bool | None = None  # the block's first piece decides: a call, or text as written
        broken, pos = "", body
        while True:
            at = len(text) - len(text[pos:].lstrip())
            if at == len(text):
                if final:
                    if passthrough:
                        content.append(text[pos:])
                    elif passthrough is None:
                        broken = "the reply ended inside a block of calls (max_tokens?)"
                return None, broken
            piece = dsml_piece(text, at, ctx, final) if self.dsml else self._piece(text, at, final)
            if piece.kind == "partial":
                if final:
                    broken = broken or "the reply ended inside a call (max_tokens?)"
                return None, broken
            if piece.kind == "close":
                if passthrough:
                    content.append(text[pos : piece.end])
                return piece.end, broken
            if piece.kind == "call":
                assert piece.call is not None
                if passthrough:
                    content.append(text[pos:at])
                passthrough = bool(passthrough)
                calls.append(piece.call)
            else:
                broken = broken or piece.why
                if passthrough is None:
                    passthrough = True
                    content.append(text[lead : piece.end])
                else:
                    content.append(text[pos if passthrough else at : piece.end])
            pos = piece.end

    def _piece(self, text: str, at: int, final: bool) -> Piece:
        """The piece of a V3/V3.1 block at `at`: a call, the block's end, or text that is neither."""
        if text.startswith(CALLS_END, at):
            return Piece("close", at + len(CALLS_END))
        if text.startswith(CALL_BEGIN, at):
            close = _close_outside_strings(text, at + len(CALL_BEGIN))
            if close < 0:
                return Piece("partial", len(text))
            end = close + len(CALL_END)
            call = self._call(text[at + len(CALL_BEGIN) : close])
            if call is None:
                return Piece("bad", end, why=f"a call that does not parse: {text[at:end][:80]!r}")
            return Piece("call", end, call)
        if partial_of(text, at, (CALL_BEGIN, CALLS_END)):
            return Piece("partial", len(text))
        # text that is no call: as far as the next call or the block's end
        stops = [i for i in (text.find(CALL_BEGIN, at), text.find(CALLS_END, at)) if i >= 0]
        if stops:
            return Piece("bad", min(stops), why=f"text inside a block of calls: {text[at:min(stops)][:80]!r}")
        if not final:
            return Piece("partial", len(text))
        return Piece("bad", len(text), why=f"text inside a block of calls: {text[at:][:80]!r}")

    def _call(self, inner: str) -> ToolCall | None:
        """A call from what lies between <｜tool▁call▁begin｜> and <｜tool▁call▁end｜>."""
        head, sep, args = inner.partition(SEP)
        if not sep:
            return None
        if self.variant == "v3":
            # `function<｜tool▁sep｜>NAME\n```json\n{...}\n````: the type, then the name on its own line
            name, _, args = args.partition("\n")
            if "```" in name:
                name, fence, after = name.partition("```")
                args = fence + after + "\n" + args
        else:
            name = head
        name = name.strip()
        obj = _fenced_json(args)
        if not name or any(c.isspace() for c in name) or obj is None:
            return None
        return ToolCall(name, dumps(obj), new_call_id())


def _close_outside_strings(text: str, start: int) -> int:
    """Where <｜tool▁call▁end｜> first appears after `start` outside a JSON string (an argument may hold
    the marker's text); -1 where it does not (yet)."""
    in_string = escaped = False
    i = start
    while True:
        j = text.find(CALL_END, i)
        if j < 0:
            return -1
        for c in text[i:j]:
            if escaped:
                escaped = False
            elif c == "\\" and in_string:
                escaped = True
            elif c == '"':
                in_string = not in_string
        if not in_string:
            return j
        # the marker's text, inside a string, holds no quote: the string goes on past it
        i, escaped = j + len(CALL_END), False


def _fenced_json(text: str) -> dict[str, Any] | None:
    """A JSON object, bare or in a ``` (```json) fence, and nothing else but whitespace."""
    body = text.strip()
    if body.startswith("```"):
        body = body[3:]
        if body.startswith("json"):
            body = body[4:]
        body = body.lstrip()
    try:
        obj, end = _DECODER.raw_decode(body)
    except (ValueError, RecursionError):  # JSONDecodeError, or an integer past the digit limit
        return None
    tail = body[end:].strip()
    if tail not in ("", "```"):
        return None
    if isinstance(obj, str):  # arguments written as a JSON string holding the object (a template's tojson)
        try:
            obj = json.loads(obj)
        except (ValueError, RecursionError):  # JSONDecodeError, or an integer past the digit limit
            return None
    return obj if isinstance(obj, dict) else None

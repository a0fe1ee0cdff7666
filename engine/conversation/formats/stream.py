"""A reply read as it is generated: content and reasoning go out as they come, a possible marker is held
until it is one or is not, and a call goes out whole once it is closed. What a stream sends, added up, is
what the whole reply parses to (the format's prefix property, formats/base.py)."""

from swarmtune.engine.conversation.formats.base import Format, held_tail
from swarmtune.engine.conversation.formats.reply import Reply, ReplyContext, ToolCall


def parse(fmt: Format, text: str, ctx: ReplyContext, final: bool) -> Reply:
    """The format's parse; where the request offered no tools, its reasoning and content only (a call the
    model writes anyway stays content, as llama-server leaves it). A reply no format can read (one a parser
    refuses, say a number past Python's digit limit) is content as written, and says so: a reply never
    takes the server down."""
    try:
        return fmt.parse(text, ctx, final) if ctx.calls else fmt.parse_without_calls(text, ctx, final)
    except (ValueError, RecursionError) as e:
        return Reply(text, broken=f"the reply could not be read in its format: {type(e).__name__}")


class ReplyStream:
    def __init__(self, fmt: Format, ctx: ReplyContext) -> None:
        self.fmt, self.ctx = fmt, ctx
        self.text = ""
        self.content = ""  # sent so far
        self.reasoning = ""
        self.calls: list[ToolCall] = []
        self.broken = ""

    def feed(self, piece: str) -> Reply:
        """What of the reply so far can go out now and has not gone out yet."""
        self.text += piece
        visible = self.text[: len(self.text) - held_tail(self.text, self.fmt.markers)]
        # trailing whitespace waits: a format may drop it before a call or at the end
        return self._send(parse(self.fmt, visible, self.ctx, final=False), hold_space=True)

    def finish(self) -> Reply:
        """The rest, once the reply has ended."""
        last = parse(self.fmt, self.text, self.ctx, final=True)
        self.broken = last.broken
        return self._send(last, hold_space=False)

    def result(self) -> Reply:
        """Everything sent, as one reply (after finish)."""
        return Reply(self.content, self.reasoning, tuple(self.calls), self.broken)

    def _send(self, r: Reply, hold_space: bool) -> Reply:
        content = r.content.rstrip() if hold_space else r.content
        reasoning = r.reasoning.rstrip() if hold_space else r.reasoning
        new_content = content[len(self.content):] if content.startswith(self.content) else ""
        new_reasoning = reasoning[len(self.reasoning):] if reasoning.startswith(self.reasoning) else ""
        new_calls = r.calls[len(self.calls):]
        self.content += new_content
        self.reasoning += new_reasoning
        self.calls.extend(new_calls)
        return Reply(new_content, new_reasoning, tuple(new_calls))

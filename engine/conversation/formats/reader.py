"""How one request's reply is read: the model's format, what the request adds (its tools, where its prompt
left the reply, whether reasoning is split off), and what the records call the format. The server makes one
per request; the engine's thread reads the reply once more at the request's end, for its record (the family,
its reasoning, a call that did not parse)."""

from dataclasses import dataclass

from swarmtune.engine.conversation.formats.base import Format
from swarmtune.engine.conversation.formats.reply import Reply, ReplyContext
from swarmtune.engine.conversation.formats.stream import ReplyStream, parse


@dataclass(frozen=True)
class ReplyReader:
    fmt: Format
    ctx: ReplyContext
    label: str  # the family, or "unknown (read as qwen3-hermes)"

    def stream(self) -> ReplyStream:
        return ReplyStream(self.fmt, self.ctx)

    def whole(self, text: str) -> Reply:
        """The reply read in one piece: by the same stream, so that a client sees the same either way."""
        s = self.stream()
        s.feed(text)
        s.finish()
        return s.result()

    def read(self, text: str) -> Reply:
        """The whole reply in one parse, for its record (the client was answered by a stream or by whole)."""
        return parse(self.fmt, text, self.ctx, final=True)

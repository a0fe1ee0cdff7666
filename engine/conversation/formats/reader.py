"""How one request's reply is read: the model's format, what the request adds (its tools, where its prompt
left the reply, whether reasoning is split off), and what the records call the format. The server makes one
per request; the engine's thread asks it, at the request's end, whether a call the model began failed."""

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

    def broken(self, text: str) -> str:
        """Why a call the model began in `text` did not parse ("" where none failed)."""
        return parse(self.fmt, text, self.ctx, final=True).broken if self.ctx.calls else ""

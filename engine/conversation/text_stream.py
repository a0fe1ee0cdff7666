"""A reply's text as it streams: token bytes in, whole characters out, stop sequences cut before they show.

A character can span tokens (an emoji, a CJK character in a byte-level vocabulary), so bytes are held
until they decode. A stop sequence can span tokens too, so text that could be the start of one is held
until the next token says whether it is: the client never sees a stop sequence, not even its first part."""

import codecs
from dataclasses import dataclass, field

_UTF8 = codecs.getincrementaldecoder("utf-8")


@dataclass
class TextStream:
    stop: tuple[str, ...] = ()
    text: str = ""  # everything sent so far
    stopped: bool = False
    matched: str | None = None  # the stop sequence it stopped at
    _held: str = ""  # decoded, not yet sent: it may begin a stop sequence
    _decoder: codecs.IncrementalDecoder = field(default_factory=lambda: _UTF8("replace"))

    def feed(self, data: bytes) -> str:
        """The text that may be sent now. Once a stop sequence is found, nothing more (`stopped`)."""
        if self.stopped:
            return ""
        pending = self._held + self._decoder.decode(data)
        found = [(i, s) for s in self.stop if s and (i := pending.find(s)) >= 0]
        if found:
            cut, self.matched = min(found)
            self.stopped = True
            self._held = ""
            return self._send(pending[:cut])
        keep = self._longest_stop_prefix(pending)
        self._held = pending[len(pending) - keep :] if keep else ""
        return self._send(pending[: len(pending) - keep])

    def finish(self) -> str:
        """The end of the reply: what was held (a stop's start that never completed, a cut character)."""
        if self.stopped:
            return ""
        rest = self._held + self._decoder.decode(b"", final=True)
        self._held = ""
        return self._send(rest)

    def _send(self, s: str) -> str:
        self.text += s
        return s

    def _longest_stop_prefix(self, s: str) -> int:
        """How many of s's last characters are the start of some stop sequence."""
        best = 0
        for stop in self.stop:
            for n in range(min(len(stop) - 1, len(s)), best, -1):
                if s.endswith(stop[:n]):
                    best = n
                    break
        return best

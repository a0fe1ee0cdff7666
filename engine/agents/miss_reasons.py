"""Why a served prompt prefilled what its conversation had held, in words a user can act on: its cells
dropped, the conversation edited (and where), the last reply sent back in other tokens, displaced by
another conversation and come back, or new (engine/conversation/cache_miss.py words each)."""

from collections import deque
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from swarmtune.engine.agents.agent import Agent
from swarmtune.engine.agents.cell_reuse import MIN_COPY_TOKENS, known
from swarmtune.engine.backends.backend import Backend
from swarmtune.engine.conversation import cache_miss
from swarmtune.engine.conversation.cache_miss import CacheMiss
from swarmtune.engine.conversation.token_hashes import common_prefix

if TYPE_CHECKING:
    from swarmtune.engine.agents.served_request import ServedRequest

# displaced conversations remembered, to say so when one comes back: each new conversation is compared with
# them token by token on the engine's thread, as with every free agent, so they are few
DISPLACED_KEPT = 16


class MissReasons:
    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        # conversations displaced from their agent, newest last: (their tokens, who displaced them), so that
        # one coming back can be told it was displaced rather than new
        self.displaced: deque[tuple[list[int], str]] = deque(maxlen=DISPLACED_KEPT)

    def why(self, held: list[int], keep: int, req: "ServedRequest", dropped: bool, prompt_end: int | None,
            agents: list[Agent]) -> CacheMiss | None:
        """Why req prefilled what its conversation had held (None: nothing but its new suffix)."""
        if dropped:
            return cache_miss.dropped(req.cached_tokens)
        if held:
            return self._diverged(held, keep, req, prompt_end) if keep < len(held) else None
        if (back := self._came_back(req)) is not None:
            return back
        donor = next((d for d in agents if d.id == req.copied_from), None)
        if donor is not None and 0 < req.system_tokens and req.copied_tokens > req.system_tokens + MIN_COPY_TOKENS:
            # it shares more than the system prompt (and the next message's header) with another conversation:
            # that one, edited (it stays whole on its agent for its own return)
            m = cache_miss.diverged(known(donor), req.prompt, req.copied_tokens, req.system_tokens, self.text)
            cause, _, then = m.words.partition(": ")
            return replace(m, words=f"{cause} ({req.copied_tokens:,} tokens copied from agent {donor.id}, whose "
                                    f"conversation stays whole): {then}")
        return cache_miss.new_conversation(req.copied_tokens, f"agent {req.copied_from}")

    def _diverged(self, held: list[int], keep: int, req: "ServedRequest", end: int | None) -> CacheMiss | None:
        """Why a continuing conversation's prompt left its history at `keep` (None: only the one token
        every turn prefills)."""
        if keep >= len(req.prompt) - 1:
            return None
        text = self.text
        if end is not None and keep >= end:
            n = len(held) - keep
            return CacheMiss(keep, "reply", f"the client sent the last reply back in other tokens: its last {n:,} "
                             "tokens prefilled again", text(held[keep : keep + cache_miss.EXCERPT_TOKENS]),
                             text(req.prompt[keep : keep + cache_miss.EXCERPT_TOKENS]))
        return cache_miss.diverged(held, req.prompt, keep, req.system_tokens, text)

    def text(self, tokens: Sequence[int]) -> str:
        return b"".join(self.backend.text.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")

    def _came_back(self, req: "ServedRequest") -> CacheMiss | None:
        """A conversation displaced earlier that comes back: it matches one further than any agent does."""
        best, by = 0, ""
        for tokens, who in self.displaced:
            n = common_prefix(tokens, req.prompt)
            if n > best:
                best, by = n, who
        if best <= max(req.copied_tokens, MIN_COPY_TOKENS):
            return None
        return cache_miss.displaced(req.copied_tokens, by)

"""A served conversation: what outlives each of its requests, in one object per agent. The request it serves
now (its prompt's provenance, its cache miss, its latency and energy ride on it), the key that pins it, the
length of its last prompt, and when its client last used it, was last replied to, and tends to come back."""

import time
from dataclasses import dataclass

from swarmtune.engine.agents.served_request import ServedRequest

# a waiting conversation is expected back within this many of its usual gaps (plus a grace for a client's
# own work); past that the worth of its cells fades, as a finished conversation's should
RETURN_GAPS, RETURN_GRACE_S = 4, 2.0


@dataclass
class Conversation:
    request: ServedRequest | None = None  # the one it serves now
    key: str | None = None  # an explicit key pins it to its agent
    prompt_end: int | None = None  # the length of the last prompt it took
    last_used: float | None = None  # perf_counter seconds: its last request's assignment, or its last reply
    replied_at: float | None = None  # its last reply, until its client comes back
    gap_s: float | None = None  # how long its client tends to take to come back (a moving mean)

    def forget(self) -> None:
        """Its agent begins another conversation: what pinned and measured this one goes."""
        self.key = self.prompt_end = self.gap_s = None

    def replied(self) -> None:
        self.replied_at = self.last_used = time.perf_counter()

    def came_back(self) -> float | None:
        """Its client's next request arrived: the gap since the reply (None where it was not replied to)."""
        if self.replied_at is None:
            return None
        gap = time.perf_counter() - self.replied_at
        self.replied_at = None
        self.gap_s = gap if self.gap_s is None else self.gap_s + 0.5 * (gap - self.gap_s)
        return gap

    def likely_back(self, typical_s: float | None, now: float) -> float:
        """How likely its client still comes back, 1 while within its usual gaps (or the swarm's typical one,
        before its own is known), then fading as it waits on."""
        gap = self.gap_s if self.gap_s is not None else typical_s
        waited = now - (self.replied_at if self.replied_at is not None else
                        self.last_used if self.last_used is not None else now)
        patience = RETURN_GAPS * gap + RETURN_GRACE_S if gap is not None else None
        return 1.0 if patience is None or waited <= patience else patience / waited


class Conversations(dict[int, Conversation]):
    """Every agent's conversation, by agent id: an agent without one has none yet."""

    def of(self, agent_id: int) -> Conversation:
        c = self.get(agent_id)
        if c is None:
            c = self[agent_id] = Conversation()
        return c

    def request(self, agent_id: int) -> ServedRequest | None:
        c = self.get(agent_id)
        return c.request if c is not None else None

    def take_request(self, agent_id: int) -> ServedRequest | None:
        """The request its agent served, which now ends: the conversation serves none."""
        c = self.get(agent_id)
        if c is None:
            return None
        req, c.request = c.request, None
        return req

    def key(self, agent_id: int) -> str | None:
        c = self.get(agent_id)
        return c.key if c is not None else None

    def serving(self) -> list[ServedRequest]:
        return [c.request for c in self.values() if c.request is not None]

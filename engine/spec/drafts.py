"""Which drafts ride a decode step: each agent's from the n-gram drafter, at most the draft length in force,
none past its context or its turn's limit, none where its backend cannot verify them exactly, and no more
rows than one call carries. Counts what each agent's drafts earned, on the agent: drafted against kept."""

from collections.abc import Callable

from swarmtune.engine.agents.agent import Agent
from swarmtune.engine.backends.backend import Backend
from swarmtune.engine.spec.draft_policy import DraftPolicy
from swarmtune.engine.spec.ngram_drafter import NgramDrafter


class Drafts:
    def __init__(self, backend: Backend, turn_left: Callable[[Agent], int]) -> None:
        self.backend = backend
        self.turn_left = turn_left  # tokens an agent's turn may still generate
        self.drafter = NgramDrafter()
        self.policy: DraftPolicy | None = None  # --draft auto: the lengths from what was measured
        self.room = 0  # the drafted rows a sequence the backend's contexts are made for (allow_drafts)

    def make_room(self, n: int) -> bool:
        """Contexts made from now on verify up to n drafts a sequence; True where that is more than the live one
        was made for (it must be made again before n can ride)."""
        if n <= self.room:
            return False
        self.backend.allow_drafts(n)
        self.room = n
        return True

    def set_length(self, n: int, auto: bool) -> None:
        """At most n tokens an agent; auto: each agent's length from the policy."""
        if not auto:
            self.policy = None
        elif self.policy is None or self.policy.max_tokens != n:
            self.policy = DraftPolicy(n)

    def for_batch(self, batch: list[Agent], n: int) -> list[list[int]] | None:
        """Each batched agent's drafts for this step ([] for none), n at most each; None where none has any."""
        rows_left = self.backend.max_chunk_tokens - len(batch)
        lengths = self.policy.lengths([a.id for a in batch]) if self.policy is not None else [n] * len(batch)
        out = []
        for a, want in zip(batch, lengths, strict=True):
            # its fed token and its drafts take cells; the token drawn after the last draft needs one more
            room = min(want, a.limit - a.context - 3, self.turn_left(a) - 1, rows_left)
            d = self.drafter.draft(a, room) if room > 0 and self.backend.why_no_drafts(a.seq) is None else []
            rows_left -= len(d)
            out.append(d)
        return out if any(out) else None

    def observed(self, batch: int, seconds: float, drafted: int) -> None:
        """A decode step's time, for the policy (--draft auto)."""
        if self.policy is not None:
            self.policy.observed(batch, seconds, drafted)

    def verified(self, a: Agent, drafted: int, agreed: int) -> None:
        """a drafted these tokens into a step, and its draws agreed with the first `agreed` of them."""
        a.drafts_verified(drafted, agreed)
        if self.policy is not None:
            self.policy.verified(a.id, drafted, agreed)

"""Which drafts ride a decode step: each agent's from the n-gram drafter, at most the draft length in force,
none past its context or its turn's limit, none where its backend cannot verify them exactly, and no more
rows than one call carries. Counts what each agent's drafts earned, on the agent: drafted against kept."""

from collections.abc import Callable

from swarmtune.engine.agents.agent import Agent
from swarmtune.engine.backends.backend import Backend
from swarmtune.engine.spec.ngram_drafter import NgramDrafter


class Drafts:
    def __init__(self, backend: Backend, turn_left: Callable[[Agent], int]) -> None:
        self.backend = backend
        self.turn_left = turn_left  # tokens an agent's turn may still generate
        self.drafter = NgramDrafter()

    def for_batch(self, batch: list[Agent], n: int) -> list[list[int]]:
        """Each batched agent's drafts for this step ([] for none), n at most each."""
        rows_left = self.backend.max_chunk_tokens - len(batch)
        out = []
        for a in batch:
            # its fed token and its drafts take cells; the token drawn after the last draft needs one more
            room = min(n, a.limit - a.context - 3, self.turn_left(a) - 1, rows_left)
            d = self.drafter.draft(a, room) if room > 0 and self.backend.why_no_drafts(a.seq) is None else []
            rows_left -= len(d)
            out.append(d)
        return out

    @staticmethod
    def verified(a: Agent, drafted: int, agreed: int) -> None:
        """a drafted these tokens into a step, and its draws agreed with the first `agreed` of them."""
        a.drafted += drafted
        a.accepted += agreed

"""An agent's cells, changed together with its history. What drives the agents (the synthetic swarm, the
served conversations) asks here ("begin again from this prompt", "continue from k cells", "copy the cells of
agent Y", "keep k cells and these chunks") and never edits the backend's cells itself, so that an agent's
history and the cells that hold it cannot part; the engine's step (batch_runner.py, kv/residency.py,
kv/switch.py) is the only other code that touches them."""

from collections.abc import Sequence

from swarmtune.engine.agents.agent import Agent, Residency
from swarmtune.engine.backends.backend import Backend
from swarmtune.engine.conversation.chunk_reuse import Chunk


class Cells:
    def __init__(self, backend: Backend) -> None:
        self._backend = backend

    def free(self, a: Agent) -> None:
        """Its cells go with it: it leaves the swarm."""
        self._backend.cells.drop(a.seq)

    def restart(self, a: Agent, prompt: list[int]) -> None:
        """Its cells go: it begins again from prompt (a new task, a displaced conversation)."""
        self._backend.cells.drop(a.seq)
        a.start(prompt)

    def continue_from(self, a: Agent, keep: int) -> None:
        """Only the first `keep` tokens of its conversation stay: the cells past them go (a swapped-out
        history is dropped first: its saved state holds the whole of it, prefilled again up to `keep`)."""
        if a.residency is Residency.HOST:
            a.evict()
        if a.residency is Residency.CACHE:
            self._backend.cells.truncate(a.seq, keep)
        a.rewound(keep)

    def copy_from(self, donor: Agent, a: Agent) -> None:
        """a's stream becomes a copy of donor's (a shared prefix; the caller keeps what it needs of it)."""
        self._backend.cells.copy(donor.seq, a.seq)
        a.copied(donor.history)

    def cut(self, a: Agent, keep: int, chunks: Sequence[Chunk]) -> list[object]:
        """Its first `keep` cells stay; each chunk's cells are saved apart (one handle each) to be put back
        shifted, once its prefill reaches them; the rest go."""
        handles = self._backend.cells.cut(a.seq, keep, chunks)
        a.truncated(keep)
        return handles

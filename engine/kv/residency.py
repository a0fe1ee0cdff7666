"""Where a waiting agent's history lives (the residency setting: kept in the KV cache, swapped out to host
memory, or dropped) and how it comes back, with every move between them logged for the next record."""

from swarmtune.engine.agents.agent import Agent, Residency
from swarmtune.engine.backends.backend import Backend, NoKVSlot
from swarmtune.engine.record.records import Move
from swarmtune.engine.settings import EngineSettings


class MoveLog:
    """The histories moved since the last record: swaps out and in, drops, a KV switch's conversions, pastes.
    A move's seconds are measured on a real backend and modeled on the sim (its cost_source)."""

    def __init__(self, cost_source: str) -> None:
        self.cost_source = cost_source
        self._moves: list[Move] = []
        self._lost_tokens = 0  # cells histories lost since the last record (preempted, dropped, refused)

    def add(self, a: Agent, op: str, nbytes: float, seconds: float, cells: int = 0,
            source: str | None = None) -> None:
        self._moves.append(Move(a.id, op, int(nbytes), seconds, source or self.cost_source, cells))

    def lose(self, a: Agent) -> None:
        """a's cells are about to go for good: what it held is prefilled again when it runs next."""
        self._lost_tokens += a.context

    def take_lost(self) -> int:
        """The tokens histories lost since the last take, for the record being made."""
        lost, self._lost_tokens = self._lost_tokens, 0
        return lost

    def take(self) -> list[Move]:
        """Every move since the last take, for the record being made."""
        moved, self._moves = self._moves, []
        return moved

    def seconds(self, prefix: str) -> float:
        """The seconds of the moves not yet taken whose op starts with prefix."""
        return sum(m.seconds for m in self._moves if m.op.startswith(prefix))

    def forget(self, prefix: str) -> None:
        """A KV switch that converted nothing after all: its moves did not happen to the swarm."""
        self._moves = [m for m in self._moves if not m.op.startswith(prefix)]


class Parking:
    """Moves an agent's history out of the KV cache when it waits (as the residency setting says) and back
    when its tool returns; past the host-memory bound the least recently served swapped histories go."""

    def __init__(self, backend: Backend, settings: EngineSettings, moves: MoveLog) -> None:
        self.backend = backend
        self.s = settings  # the engine's own: its residency, KV type and host bound as they are now
        self.moves = moves

    def park(self, a: Agent, agents: list[Agent]) -> None:
        """a just called a tool: keep its cells, swap them out to host memory, or drop them."""
        if self.s.residency == "keep" or not a.context:
            return
        if self.s.residency == "swap":
            handle, nbytes, seconds = self.backend.cells.save_seq(a.seq)
            self.backend.cells.drop(a.seq)
            a.swapped_out(handle)
            self.moves.add(a, "swap_out", nbytes, seconds)
            self._bound_swapped(agents)
            return
        self.drop(a)

    def drop(self, a: Agent) -> None:
        """a's cells go (its history is prefilled again when it runs next)."""
        self.moves.lose(a)
        self.backend.cells.drop(a.seq)
        self.moves.add(a, "drop", self.backend.facts.bytes_model.kv_cache_bytes(self.s.kv, a.context), 0.0,
                       source="modeled")
        a.evict()

    def swap_in(self, a: Agent, room_tokens: int) -> None:
        """a's tool returned with its history in host memory: back into the cache where the budget has room,
        else dropped (prefilled again when there is)."""
        try:
            if a.context > room_tokens:
                raise NoKVSlot()
            seconds = self.backend.cells.restore_seq(a.seq, a.swapped)
            self.moves.add(a, "swap_in", getattr(a.swapped, "nbytes", 0), seconds)
            a.swapped_in()
        except NoKVSlot:
            self.moves.add(a, "swap_in_refused", 0, 0.0)
            self.moves.lose(a)
            a.evict()

    def _bound_swapped(self, agents: list[Agent]) -> None:
        limit = self.s.swap_limit_bytes
        if limit is None:
            return
        swapped = sorted((a for a in agents if a.residency is Residency.HOST),
                         key=lambda a: (a.last_served_step, a.id))
        total = sum(getattr(a.swapped, "nbytes", 0) for a in swapped)
        while swapped and total > limit:
            a = swapped.pop(0)
            total -= getattr(a.swapped, "nbytes", 0)
            self.moves.add(a, "swap_evicted", getattr(a.swapped, "nbytes", 0), 0.0)
            self.moves.lose(a)
            a.evict()

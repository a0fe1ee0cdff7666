"""Drafts from the agents' own text: the tokens that followed the last time an agent's newest n-gram
appeared, in its own history first, then in any agent's (a shared pool), as llama.cpp's n-gram speculation
drafts (--spec-type ngram-*). No second model: coding agents copy what is already in their context (a
whole-file edit re-emits the file, a diff repeats the lines around it), so the continuation they will write
is often one they wrote or read before. A draft is a guess; the step verifies it (engine/batch_runner.py).

Each agent's tokens are indexed as they grow: for every n-gram size, the position that followed its latest
occurrence. An edit (a change not at the end: Agent.edits) makes its index again."""

from dataclasses import dataclass, field

from swarmtune.engine.agents.agent import Agent

NGRAM_SIZES = (3, 2)  # longest first: a longer match is the surer guess


def _key(tokens: list[int], end: int, n: int) -> int:
    # the n tokens before `end` as one int (tokens < 2**20 each; 2**20 > any vocabulary llama.cpp loads here):
    # ints are smaller dict keys than tuples, and the index holds one per token per size
    k = n
    for t in tokens[end - n:end]:
        k = (k << 20) | t
    return k


@dataclass
class _Indexed:
    """How far an agent's history is indexed, and under which edit count (a new edit: made again)."""

    upto: int = 0
    edits: int = 0
    at: dict[int, int] = field(default_factory=dict)  # n-gram key -> the position after its latest occurrence


class NgramDrafter:
    """Owns the indexes: each agent's, and the pool over every agent's history."""

    def __init__(self) -> None:
        self._own: dict[int, _Indexed] = {}
        self._pool: dict[int, tuple[list[int], int]] = {}  # key -> (an agent's history, the position after)

    def draft(self, agent: Agent, n_max: int) -> list[int]:
        """Up to n_max tokens that may follow agent's history and its next token; [] where nothing matches.

        A match's run ends where the history does. There the lookup goes on from the run's own last tokens, as
        llama.cpp's ngram-mod drafts each token from the n tokens before it, drafted ones included: text that
        repeats itself (a line written again and again, a table's rows) is what the newest occurrence of its
        n-gram has the least after, and what an agent will most likely write again."""
        if n_max <= 0 or agent.next_token is None:
            return []
        hist = agent.history
        idx = self._index(agent)
        n_top = max(NGRAM_SIZES)
        tail = hist[-(n_top - 1):] + [agent.next_token]
        out: list[int] = []
        while len(out) < n_max:
            run = self._run(hist, idx, tail, n_max - len(out))
            if not run:
                break
            out += run
            tail = (tail + run)[-n_top:]
        return out

    def _run(self, hist: list[int], idx: _Indexed, tail: list[int], n_max: int) -> list[int]:
        """What followed the newest occurrence of tail's longest indexed n-gram: in the agent's own text first,
        then in the pool; at most n_max tokens, fewer where that text ends."""
        for n in NGRAM_SIZES:
            if len(tail) < n:
                continue
            k = _key(tail, len(tail), n)
            pos = idx.at.get(k)
            if pos is not None:
                return hist[pos:pos + n_max]
            seen = self._pool.get(k)
            if seen is not None and seen[1] < len(seen[0]):
                return seen[0][seen[1]:seen[1] + n_max]
        return []

    def _index(self, agent: Agent) -> _Indexed:
        hist = agent.history
        idx = self._own.get(agent.id)
        if idx is None or idx.edits != agent.edits or idx.upto > len(hist):
            idx = self._own[agent.id] = _Indexed(edits=agent.edits)
        at, pool = idx.at, self._pool
        # each position i whose token exists: the n tokens before it map to i
        for i in range(max(idx.upto, 1), len(hist)):
            for n in NGRAM_SIZES:
                if i >= n:
                    k = _key(hist, i, n)
                    at[k] = i
                    pool[k] = (hist, i)
        idx.upto = len(hist)
        return idx

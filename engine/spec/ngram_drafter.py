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
# how far back a draft's match is followed (tokens agreeing before the n-gram), and where its class changes:
# a guess behind 24 agreeing tokens (llama.cpp's ngram-mod drafts only there) is kept far more often than one
# behind 3, and --draft auto measures each class's share kept apart (engine/spec/draft_policy.py)
MATCH_MAX = 24
MATCH_CLASSES = (8, 24)


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
        return self.lookup(agent, n_max)[0]

    def lookup(self, agent: Agent, n_max: int) -> tuple[list[int], int]:
        """Up to n_max tokens that may follow agent's history and its next token ([] where nothing matches),
        and the class of the match behind them (match_class: 0 for none or a short one).

        A match's run ends where the history does. There the lookup goes on from the run's own last tokens, as
        llama.cpp's ngram-mod drafts each token from the n tokens before it, drafted ones included: text that
        repeats itself (a line written again and again, a table's rows) is what the newest occurrence of its
        n-gram has the least after, and what an agent will most likely write again."""
        if n_max <= 0 or agent.next_token is None:
            return [], 0
        hist = agent.history
        idx = self._index(agent)
        n_top = max(NGRAM_SIZES)
        tail = hist[-(n_top - 1):] + [agent.next_token]
        out: list[int] = []
        matched = 0
        while len(out) < n_max:
            found = self._run(hist, idx, tail, n_max - len(out))
            if found is None:
                break
            h, pos, n = found
            if not out:  # the first run's match is the draft's: its length says how sure a guess it is
                matched = _match_len(hist, agent.next_token, h, pos, n)
            run = h[pos:pos + n_max - len(out)]
            out += run
            tail = (tail + run)[-n_top:]
        return out, match_class(matched)

    def _run(self, hist: list[int], idx: _Indexed, tail: list[int], n_max: int) -> tuple[list[int], int, int] | None:
        """Where the newest occurrence of tail's longest indexed n-gram is: in the agent's own text first, then
        in the pool; the text, the position after it (a token follows there), and the n-gram's size."""
        for n in NGRAM_SIZES:
            if len(tail) < n:
                continue
            k = _key(tail, len(tail), n)
            pos = idx.at.get(k)
            if pos is not None:
                return hist, pos, n
            seen = self._pool.get(k)
            if seen is not None and seen[1] < len(seen[0]):
                return seen[0], seen[1], n
        return None

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


def _match_len(hist: list[int], nxt: int, h: list[int], pos: int, n: int) -> int:
    """Tokens that agree going back from the end of hist + [nxt] and from pos in h (the n-gram's n at least),
    up to MATCH_MAX."""
    length, i, j = n, len(hist) - n, pos - n - 1  # the tokens before the n-gram's first, on each side
    while length < MATCH_MAX and i >= 0 and j >= 0 and hist[i] == h[j]:
        length, i, j = length + 1, i - 1, j - 1
    return length


def match_class(length: int) -> int:
    """0 for no match or one shorter than MATCH_CLASSES[0], then one more for each threshold it reaches."""
    return sum(length >= c for c in MATCH_CLASSES)

"""The cache check (`--check`, and the tests): every agent's cells are exactly its history. A cache that lost
or gained tokens makes every later number fiction, so a run that checks stops at the first difference."""

from swarmtune.engine.agents.agent import Agent, Residency
from swarmtune.engine.backends.backend import Backend, CacheMismatch


def check_caches(backend: Backend, agents: list[Agent]) -> None:
    """Every live agent's cells are exactly its history (positions 0..len-1); every other sequence is
    empty. Raises CacheMismatch."""
    used: set[int] = set()
    bm = backend.facts.bytes_model
    # windowed layers drop cells past their window, and a recurrent state holds only its last position:
    # there the first position held may be past 0, the last one never differs
    keeps_all = not bm.has_swa and not bm.state_bytes
    for a in agents:
        if a.seq >= backend.n_seqs:
            continue  # added beyond the open streams: it starts at the next rebuild
        used.add(a.seq)
        lo, hi = backend.cells.span(a.seq)
        if a.residency is not Residency.CACHE or not a.context:
            ok = (lo, hi) == (-1, -1)
        else:
            ok = hi == a.context - 1 and (lo == 0 if keeps_all else 0 <= lo <= hi)
        if not ok:
            raise CacheMismatch(f"agent {a.id} (sequence {a.seq}, {a.state.value}) has {a.context} tokens of "
                                f"history but its cache holds positions {lo}..{hi}")
    for seq in range(backend.n_seqs):
        if seq not in used and backend.cells.span(seq) != (-1, -1):
            raise CacheMismatch(f"sequence {seq} belongs to no agent but holds positions {backend.cells.span(seq)}")

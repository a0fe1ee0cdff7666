"""Where a served prompt's tokens already are, found without walking every agent's conversation: each agent's
known tokens (its history and what waits to be prefilled) hashed once as they grow (engine/agents/
token_hashes.py), and two maps from hashes to the agents that hold them:

- blocks: the prefix hash at every BLOCK_TOKENS boundary. Agents that share a prompt's first k blocks hold
  its k-th boundary hash, and those that share k + 1 are among them, so the agents that share most of a
  prompt are found by a binary search over its boundaries (as vLLM's and SGLang's prefix caches hash blocks);
- anchors: the least seed hash of every window of seeds (chunk_reuse's runs). A run of old cells that
  --cache-reuse could keep is at least as long as a window and its seed, so the agents that could give one
  are those holding one of the prompt's anchors past where their prefix ends. Only they are planned.

Hashes find candidates; a collision (64 bits) could only rank an agent wrongly: what is cut, copied and kept
is computed on the tokens themselves. An agent's hashes are extended by what it appended and rebuilt after
an edit (Agent.edits)."""

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from swarmtune.engine.agents.agent import Agent
from swarmtune.engine.conversation.chunk_reuse import Chunk
from swarmtune.engine.conversation.token_hashes import (
    HEADROOM_TOKENS,
    TokenHashes,
    extend_all,
    seed_windows,
    shared_prefix,
    window_min,
)

BLOCK_TOKENS = 16


def known_slice(a: Agent, start: int, end: int) -> list[int]:
    """(a.history + a.pending)[start:end], without building the whole list."""
    h = a.history
    n = len(h)
    if end <= n:
        return h[start:end]
    if start >= n:
        return a.pending[start - n : end - n]
    return h[start:] + a.pending[: end - n]


def _hold(table: dict[int, set[int]], keys: Iterable[int], aid: int) -> None:
    get = table.get
    for x in keys:
        holders = get(x)
        if holders is None:
            table[x] = {aid}
        else:
            holders.add(aid)


def _unhold(table: dict[int, set[int]], keys: Iterable[int], aid: int) -> None:
    for x in keys:
        holders = table.get(x)
        if holders is not None:
            holders.discard(aid)
            if not holders:
                del table[x]


@dataclass
class _Known:
    edits: int  # the agent's edits when these hashes were made
    hashes: TokenHashes = field(default_factory=TokenHashes)
    blocks: list[int] = field(default_factory=list)  # the prefix hash at each block's end
    anchors: set[int] = field(default_factory=set)
    # each window's anchor (the first `windows` entries; the rest is room)
    mins: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.uint64))
    windows: int = 0  # seed windows anchored so far


@dataclass
class PromptHashes:
    tokens: list[int]
    hashes: TokenHashes
    blocks: list[int]
    window: int
    seed: int
    # what a copy of another agent's cells would give, by the agent it is for (CellReuse.best_copy)
    copies: dict[int, tuple[int, Agent | None]] = field(default_factory=dict)
    # the runs planned in an agent's tokens: (keep, its tokens then, the chunks), by agent
    plans: dict[int, tuple[int, int, list[Chunk]]] = field(default_factory=dict)
    _anchors: dict[int, int] | None = None

    @property
    def anchor_last_window(self) -> dict[int, int]:
        """Of each distinct anchor of the prompt, the last window that has it (where a run could start);
        made when first asked (a prompt that continues its agent needs none)."""
        if self._anchors is None:
            self._anchors = {}
            h = self.hashes
            if self.window and h.n >= self.seed + self.window - 1:
                mins = window_min(h.seeds(self.seed), self.window)
                # the last window of each distinct minimum: np.unique on the reversed array finds first places
                values, first_from_end = np.unique(mins[::-1], return_index=True)
                self._anchors = dict(zip(values.tolist(), (len(mins) - 1 - first_from_end).tolist(), strict=True))
        return self._anchors

    def planned(self, agent_id: int, keep: int, held: int) -> list[Chunk] | None:
        """The runs planned in that agent's tokens from keep, when it held `held` tokens (None: not planned)."""
        got = self.plans.get(agent_id)
        return got[2] if got is not None and got[:2] == (keep, held) else None


class PrefixIndex:
    def __init__(self, seed: int = 0, run_tokens: int = 0) -> None:
        self.seed = seed
        # a run of run_tokens tokens holds a whole window of this many seeds; none: no runs are looked for
        self.window = run_tokens - seed + 1 if 0 < seed <= run_tokens else 0
        self._known: dict[int, _Known] = {}
        self._blocks: dict[int, set[int]] = {}  # a block's end's prefix hash -> the agents that hold it
        self._anchors: dict[int, set[int]] = {}  # an anchor -> the agents that hold it

    # keeping up with the agents
    def sync(self, agents: Iterable[Agent], complete: bool = True) -> None:
        """These agents' hashes up to date (what each added since, hashed in one pass over them); complete:
        they are every agent, and those no longer there are forgotten."""
        seen = set()
        grown: list[tuple[int, _Known, list[int]]] = []
        for a in agents:
            seen.add(a.id)
            n = len(a.history) + len(a.pending)
            k = self._known.get(a.id)
            if k is not None and k.edits != a.edits:
                intact = a.intact_since(k.edits)
                if intact is None:
                    self._drop(a.id)
                    k = None
                else:  # what its edits left in place keeps its hashes
                    self._truncate(a.id, k, intact)
                    k.edits = a.edits
            if k is None or n < k.hashes.n:
                if k is not None:
                    self._drop(a.id)
                k = self._known[a.id] = _Known(a.edits)
                grown.append((a.id, k, a.history + a.pending))
            elif n > k.hashes.n:
                grown.append((a.id, k, known_slice(a, k.hashes.n, n)))
        for gone in [i for i in self._known if complete and i not in seen]:
            self._drop(gone)
        if grown:
            self._append(grown)

    def _truncate(self, aid: int, k: _Known, n: int) -> None:
        if n >= k.hashes.n:
            return
        k.hashes.truncate(n)
        blocks = n // BLOCK_TOKENS
        _unhold(self._blocks, k.blocks[blocks:], aid)
        del k.blocks[blocks:]
        if self.window:
            windows = max(0, n - self.seed - self.window + 2)
            if windows < k.windows:
                cut = np.unique(k.mins[windows : k.windows])
                gone = cut[~np.isin(cut, k.mins[:windows])].tolist()  # anchors no window left holds
                k.anchors.difference_update(gone)
                _unhold(self._anchors, gone, aid)
                k.windows = windows

    def _append(self, grown: list[tuple[int, _Known, list[int]]]) -> None:
        had = [k.hashes.n for _, k, _ in grown]
        extend_all([k.hashes for _, k, _ in grown], [t for _, _, t in grown])
        for (aid, k, _), n in zip(grown, had, strict=True):
            h = k.hashes
            first, last = n // BLOCK_TOKENS + 1, h.n // BLOCK_TOKENS
            if last >= first:
                new = h.prefix[first * BLOCK_TOKENS : last * BLOCK_TOKENS + 1 : BLOCK_TOKENS].tolist()
                k.blocks += new
                _hold(self._blocks, new, aid)
        if not self.window:
            return
        fresh_mins = seed_windows([k.hashes for _, k, _ in grown], [k.windows for _, k, _ in grown], self.seed,
                                  self.window)
        for (aid, k, _), mins in zip(grown, fresh_mins, strict=True):
            if not len(mins):
                continue
            windows = k.windows + len(mins)
            if len(k.mins) < windows:  # room to grow into, as a list doubles
                more = np.empty(max(windows + HEADROOM_TOKENS, 2 * len(k.mins)), dtype=np.uint64)
                more[: k.windows] = k.mins[: k.windows]
                k.mins = more
            k.mins[k.windows : windows] = mins
            fresh = set(mins.tolist()) - k.anchors
            k.anchors |= fresh
            _hold(self._anchors, fresh, aid)
            k.windows = windows

    def _drop(self, aid: int) -> None:
        k = self._known.pop(aid)
        _unhold(self._blocks, k.blocks, aid)
        _unhold(self._anchors, k.anchors, aid)

    # a prompt
    def prompt(self, tokens: list[int]) -> PromptHashes:
        h = TokenHashes(tokens)
        return PromptHashes(tokens, h, h.prefix[BLOCK_TOKENS : h.n + 1 : BLOCK_TOKENS].tolist(), self.window,
                            self.seed)

    def prefix(self, a: Agent, p: PromptHashes, blocks: int | None = None) -> int:
        """The tokens a's known tokens share with the prompt's first (by their hashes); blocks: the whole
        blocks they are known to share, and no more (deepest's answer)."""
        k = self._known[a.id]
        if blocks is None:
            return shared_prefix(k.hashes, p.hashes)
        return shared_prefix(k.hashes, p.hashes, blocks * BLOCK_TOKENS, (blocks + 1) * BLOCK_TOKENS)

    def deepest(self, p: PromptHashes, ids: set[int]) -> tuple[int, set[int]]:
        """The most whole blocks of the prompt that any of ids holds, and which of them hold that many
        (every one of the others holds fewer)."""
        hi = len(p.blocks)
        lo = 0  # every id shares 0 blocks
        while lo < hi:  # the holders of block k include the holders of block k + 1
            mid = (lo + hi + 1) // 2
            holders = self._blocks.get(p.blocks[mid - 1])
            if holders is not None and not holders.isdisjoint(ids):
                lo = mid
            else:
                hi = mid - 1
        if lo == 0:
            return 0, set(ids)
        return lo, self._blocks[p.blocks[lo - 1]] & ids

    def shared_by_all(self, p: PromptHashes, ids: set[int]) -> int:
        """The most whole blocks of the prompt every one of ids holds (each shares at least that many)."""
        lo, hi = 0, len(p.blocks)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            holders = self._blocks.get(p.blocks[mid - 1])
            if holders is not None and ids <= holders:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def shared_with_others(self, of: list[Agent], others: dict[int, int]) -> dict[int, int]:
        """Of each of `of`, to a block, the most of its known tokens that another agent shares from the
        start; others: the agents that count, each with how many of its tokens do (its cells: its history).
        A binary search over each one's blocks, how many of the others hold a block counted once for all
        (a block's hash stands for its depth too)."""
        counted: dict[int, int] = {}
        out = {}
        for a in of:
            blocks = self._known[a.id].blocks
            own = others.get(a.id, 0)
            lo, hi = 0, len(blocks)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                block, need = blocks[mid - 1], mid * BLOCK_TOKENS
                n = counted.get(block)
                if n is None:
                    n = counted[block] = sum(1 for x in self._blocks.get(block, ()) if others.get(x, 0) >= need)
                if n - (own >= need) >= 1:  # another than a itself
                    lo = mid
                else:
                    hi = mid - 1
            out[a.id] = lo * BLOCK_TOKENS
        return out

    def may_hold_a_run(self, p: PromptHashes, ids: set[int], from_window: int = 0) -> dict[int, int]:
        """Of ids, those that hold one of the prompt's anchors in a window from from_window on, each with
        the last prompt window where one of its anchors is: a run it holds there can begin no later (the
        others hold no run that begins from from_window at all)."""
        out: dict[int, int] = {}
        for value, window in p.anchor_last_window.items():
            if window < from_window:
                continue
            for x in self._anchors.get(value, ()):
                if x in ids and out.get(x, -1) < window:
                    out[x] = window
        return out

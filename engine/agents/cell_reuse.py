"""What of a served prompt an agent's cells can give instead of a prefill: the prefix its own history
shares with the prompt and, with --cache-reuse, runs of its old cells that reappear later in the prompt
(put back shifted); or, for a conversation new to its agent, a copy of another agent's cells (the same
system prompt and tools, or the conversation it edits or trims). Every change to an agent's cells goes
through engine/agents/cells.py."""

from swarmtune.engine.agents.agent import Agent, AgentState, Residency
from swarmtune.engine.agents.cells import Cells
from swarmtune.engine.agents.prefix_index import BLOCK_TOKENS, PrefixIndex, PromptHashes
from swarmtune.engine.backends.backend import Backend
from swarmtune.engine.conversation import chunk_reuse
from swarmtune.engine.conversation.chunk_reuse import KeptChunk
from swarmtune.engine.conversation.token_hashes import common_prefix
from swarmtune.engine.record.records import StepRecord

# A shared prefix shorter than this is prefilled. A copy between streams moves the whole stream, but cheaply:
# measured on the default model (bench/prefix_copy.py, 2-core CPU, f16, 2,048 cells), the first token after
# a copy came 0.24x as late as after prefilling a 32-token prefix, 0.064x at 256, 0.039x at 1,024
MIN_COPY_TOKENS = 16


def known(a: Agent) -> list[int]:
    """The tokens its conversation holds: cached, swapped out, or waiting to be prefilled again."""
    return a.history + a.pending


def to_prefill(prompt: list[int], start: int, kept: list[KeptChunk]) -> list[int]:
    """prompt from start, less the kept chunks' tokens."""
    out: list[int] = []
    at = start
    for k in kept:
        out += prompt[at : k.at]
        at = k.at + len(k.tokens)
    return out + prompt[at:]


def _ema(old: float | None, new: float, weight: float = 0.2) -> float:
    return new if old is None else old + weight * (new - old)


class CellReuse:
    def __init__(self, backend: Backend, cells: Cells, cache_reuse: int, copy_prefix: bool) -> None:
        self.backend = backend
        self.cells = cells
        self.cache_reuse = cache_reuse  # the shortest run of old cells kept past a divergence; 0: off
        self.copy_prefix = copy_prefix
        # what a kept chunk saves and costs here, measured as the server runs (None: not yet seen): a chunk is
        # kept only where prefilling it would take longer than putting it back (engine/conversation/chunk_reuse.py)
        self.prefill_s_per_token: float | None = None
        self.paste_s_per_cell: float | None = None
        # where a prompt's tokens already are: the agents that share most of it, and those that may hold a
        # run --cache-reuse could keep (hashes, kept up as the agents' tokens grow)
        self.index = PrefixIndex(chunk_reuse.seed_tokens(cache_reuse), cache_reuse)

    def hashed(self, prompt: list[int], agents: list[Agent]) -> PromptHashes:
        """The prompt's hashes, against every agent's tokens as they are now."""
        self.index.sync(agents)
        return self.index.prompt(prompt)

    def longest_prefix(self, p: PromptHashes, agents: list[Agent]) -> Agent:
        """Of agents, the one whose known tokens share most of the prompt from its start (the lowest id of
        those that share as much)."""
        k, holders = self.index.deepest(p, {a.id for a in agents})
        return max((a for a in agents if a.id in holders), key=lambda a: (self.index.prefix(a, p, k), -a.id))

    def own_tokens(self, of: list[Agent], agents: list[Agent]) -> dict[int, int]:
        """Of each of `of`, its known tokens no copy of another agent's cells could give back (to a block):
        those past the most any other agent's cells share with them."""
        shared = self.index.shared_with_others(of, {d.id: len(d.history) for d in self.donors(None, agents)})
        return {a.id: len(a.history) + len(a.pending) - shared[a.id] for a in of}

    def learn(self, step: StepRecord) -> None:
        """A step's measured prefill rate and paste cost."""
        if step.kind == "prefill" and step.tokens > 0 and step.seconds > 0:
            self.prefill_s_per_token = _ema(self.prefill_s_per_token, step.seconds / step.tokens)
        for m in step.moved:
            if m.op == "paste" and m.cells > 0:
                self.paste_s_per_cell = _ema(self.paste_s_per_cell, m.seconds / m.cells)

    def cut(self, a: Agent, keep: int, prompt: list[int], planned: list[chunk_reuse.Chunk] | None = None
            ) -> list[KeptChunk]:
        """Past the divergence, runs of its old cells that reappear later in the prompt are cut out to be
        put back shifted (engine/conversation/chunk_reuse.py) rather than prefilled; the rest of its cells go.
        planned: the runs, where they were planned already on these tokens from keep."""
        held = a.history
        if (self.cache_reuse <= 0 or a.residency is not Residency.CACHE or a.pending or keep >= len(held)
                or self.backend.caps.shift is not None):
            return []
        chunks = planned if planned is not None else self.plan(held, prompt, keep)
        if not chunks:
            return []
        handles = self.cells.cut(a, keep, chunks)
        return [KeptChunk(c.prompt_at, tuple(prompt[c.prompt_at : c.prompt_at + c.tokens]), h)
                for c, h in zip(chunks, handles, strict=False)]

    def rewind(self, a: Agent, keep: int) -> None:
        """Keep only the first `keep` tokens of its conversation."""
        if keep >= len(known(a)):
            return
        self.cells.continue_from(a, keep)

    def donors(self, a: Agent | None, agents: list[Agent]) -> list[Agent]:
        return [d for d in agents if d is not a and d.residency is Residency.CACHE and d.history
                and d.state is not AgentState.PREEMPTED and d.seq < self.backend.n_seqs]

    def reusable(self, a: Agent, p: PromptHashes) -> int:
        """How many of the prompt's tokens a's known tokens would give: the common prefix, and with
        --cache-reuse the chunks after it (versions of one conversation share a prefix; the latest shares
        the most after it)."""
        n = min(self.index.prefix(a, p), len(p.tokens) - 1)
        return n + self._runs(a.id, known(a), p, n, self.index.may_hold_a_run(p, {a.id}, n).get(a.id))

    def _runs(self, owner: int, held: list[int], p: PromptHashes, keep: int, last_window: int | None) -> int:
        """The tokens of the chunks kept past keep (planned, and kept in p for a cut that follows);
        last_window: the last prompt window where held has an anchor (None: none, so no run)."""
        if self.cache_reuse <= 0 or self.backend.caps.shift:
            return 0
        chunks = self.plan(held, p.tokens, keep) if last_window is not None and last_window >= keep else []
        p.plans[owner] = (keep, len(held), chunks)
        return sum(c.tokens for c in chunks)

    def known_runs(self, owner: Agent, keep: int, p: PromptHashes) -> list[chunk_reuse.Chunk] | None:
        """The runs --cache-reuse keeps of owner's cells past keep, where already planned for this prompt
        or where the index says there are none; None: not known without a plan."""
        got = p.planned(owner.id, keep, len(owner.history))
        if got is not None:
            return got
        window = self.index.may_hold_a_run(p, {owner.id}, keep).get(owner.id)
        return [] if window is None else None

    def plan(self, held: list[int], prompt: list[int], keep: int) -> list[chunk_reuse.Chunk]:
        """The chunks --cache-reuse keeps, less those whose paste (the sequence up to its end saved and set
        again) costs more than their prefill, as both were last measured here."""
        chunks = chunk_reuse.plan(held, prompt, keep, self.cache_reuse)
        pre, paste = self.prefill_s_per_token, self.paste_s_per_cell
        if pre is None or paste is None:
            return chunks
        return [c for c in chunks if c.tokens * pre > (c.prompt_at + c.tokens) * paste]

    def shared_prefix(self, p: PromptHashes, but: Agent, agents: list[Agent]) -> int:
        """The most of the prompt a copy of another agent's cells would give."""
        return self.best_copy(p, but, agents)[0]

    def best_copy(self, p: PromptHashes, but: Agent, agents: list[Agent]) -> tuple[int, Agent | None]:
        """Of the agents but `but` whose cells could be copied, the one whose cells give most of the prompt
        (the first, in the agents' order, of those that give as much), and how much. Only the agents the
        index says could matter are measured: those that share most of the prompt's start, and those that
        may hold a run past their own prefix. Asked again for the same prompt and agent, the same answer
        (a placement asks twice; nothing it does between changes any other agent's cells)."""
        if but.id in p.copies:
            return p.copies[but.id]
        p.copies[but.id] = out = self._best_copy(p, but, agents)
        return out

    def _best_copy(self, p: PromptHashes, but: Agent, agents: list[Agent]) -> tuple[int, Agent | None]:
        donors = self.donors(but, agents)
        if not donors:
            return 0, None
        end = len(p.tokens) - 1
        ids = {d.id for d in donors}
        k, holders = self.index.deepest(p, ids)
        depth = k * BLOCK_TOKENS

        def prefix(d: Agent, blocks: int | None = None) -> int:  # what its cells (its history) give
            return min(self.index.prefix(d, p, blocks), len(d.history), end)

        gives = {d.id: prefix(d, k) for d in donors if d.id in holders}
        if max(gives.values()) < depth or not depth:
            # a history (or the prompt's end) holds every one of them below the depth: any may give as much
            gives = {d.id: prefix(d) for d in donors}
        # every donor shares at least this much: a run begins no sooner
        floor = self.index.shared_by_all(p, ids) * BLOCK_TOKENS
        runs = self.index.may_hold_a_run(p, ids, floor) if self.cache_reuse > 0 else {}
        for d in donors:
            window = runs.get(d.id)
            if window is not None:
                keep = gives[d.id] if d.id in gives else prefix(d)
                gives[d.id] = keep + self._runs(d.id, d.history, p, keep, window)
        best = max(gives.values())
        return best, next(d for d in donors if gives.get(d.id) == best)

    def copy_shared_prefix(self, a: Agent, p: PromptHashes, agents: list[Agent]) -> tuple[list[KeptChunk], int, int]:
        """A new conversation that begins as another agent's does (a system prompt, tool definitions; or
        that agent's conversation, edited or trimmed): copy those cells rather than prefill them, and the
        chunks of the rest that reappear later in the prompt (the copy moves the whole stream anyway).
        Returns (the chunks kept, the tokens copied, the agent copied from: -1 for none)."""
        if not self.copy_prefix:
            return [], 0, -1
        gives, best = self.best_copy(p, a, agents)
        if best is None or gives < MIN_COPY_TOKENS:
            return [], 0, -1
        n = min(common_prefix(best.history, p.tokens), len(p.tokens) - 1)
        planned = self.known_runs(best, n, p)
        self.cells.copy_from(best, a)
        kept = self.cut(a, n, p.tokens, planned)
        self.rewind(a, n)
        return kept, n, best.id

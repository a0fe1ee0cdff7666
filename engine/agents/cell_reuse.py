"""What of a served prompt an agent's cells can give instead of a prefill: the prefix its own history
shares with the prompt and, with --cache-reuse, runs of its old cells that reappear later in the prompt
(put back shifted); or, for a conversation new to its agent, a copy of another agent's cells (the same
system prompt and tools, or the conversation it edits or trims). Every change to an agent's cells goes
through engine/agents/cells.py."""

from swarmtune.engine.agents.agent import Agent, AgentState, Residency
from swarmtune.engine.agents.cells import Cells
from swarmtune.engine.backends.backend import Backend
from swarmtune.engine.conversation import chunk_reuse
from swarmtune.engine.conversation.chunk_reuse import KeptChunk
from swarmtune.engine.records import StepRecord

# A shared prefix shorter than this is prefilled. A copy between streams moves the whole stream, but cheaply:
# measured on the default model (bench/prefix_copy.py, 2-core CPU, f16, 2,048 cells), the first token after
# a copy came 0.24x as late as after prefilling a 32-token prefix, 0.064x at 256, 0.039x at 1,024
MIN_COPY_TOKENS = 16


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


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

    def learn(self, step: StepRecord) -> None:
        """A step's measured prefill rate and paste cost."""
        if step.kind == "prefill" and step.tokens > 0 and step.seconds > 0:
            self.prefill_s_per_token = _ema(self.prefill_s_per_token, step.seconds / step.tokens)
        for m in step.moved:
            if m.op == "paste" and m.cells > 0:
                self.paste_s_per_cell = _ema(self.paste_s_per_cell, m.seconds / m.cells)

    def cut(self, a: Agent, keep: int, prompt: list[int]) -> list[KeptChunk]:
        """Past the divergence, runs of its old cells that reappear later in the prompt are cut out to be
        put back shifted (engine/conversation/chunk_reuse.py) rather than prefilled; the rest of its cells go."""
        held = a.history
        if (self.cache_reuse <= 0 or a.residency is not Residency.CACHE or a.pending or keep >= len(held)
                or self.backend.why_no_shift() is not None):
            return []
        chunks = self.plan(held, prompt, keep)
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

    def donors(self, a: Agent, agents: list[Agent]) -> list[Agent]:
        return [d for d in agents if d is not a and d.residency is Residency.CACHE and d.history
                and d.state is not AgentState.PREEMPTED and d.seq < self.backend.n_seqs]

    def reusable(self, held: list[int], prompt: list[int]) -> int:
        """How many of prompt's tokens held's cells would give: the common prefix, and with --cache-reuse the
        chunks after it (versions of one conversation share a prefix; the latest shares the most after it)."""
        n = min(common_prefix(held, prompt), len(prompt) - 1)
        if self.cache_reuse <= 0 or self.backend.why_no_shift() is not None:
            return n
        return n + sum(c.tokens for c in self.plan(held, prompt, n))

    def plan(self, held: list[int], prompt: list[int], keep: int) -> list[chunk_reuse.Chunk]:
        """The chunks --cache-reuse keeps, less those whose paste (the sequence up to its end saved and set
        again) costs more than their prefill, as both were last measured here."""
        chunks = chunk_reuse.plan(held, prompt, keep, self.cache_reuse)
        pre, paste = self.prefill_s_per_token, self.paste_s_per_cell
        if pre is None or paste is None:
            return chunks
        return [c for c in chunks if c.tokens * pre > (c.prompt_at + c.tokens) * paste]

    def shared_prefix(self, prompt: list[int], but: Agent, agents: list[Agent]) -> int:
        """The most of the prompt a copy of another agent's cells would give."""
        return max((self.reusable(d.history, prompt) for d in self.donors(but, agents)), default=0)

    def copy_shared_prefix(self, a: Agent, prompt: list[int], agents: list[Agent]) -> tuple[list[KeptChunk], int, int]:
        """A new conversation that begins as another agent's does (a system prompt, tool definitions; or
        that agent's conversation, edited or trimmed): copy those cells rather than prefill them, and the
        chunks of the rest that reappear later in the prompt (the copy moves the whole stream anyway).
        Returns (the chunks kept, the tokens copied, the agent copied from: -1 for none)."""
        donors = self.donors(a, agents)
        if not self.copy_prefix or not donors:
            return [], 0, -1
        reuse = {d.id: self.reusable(d.history, prompt) for d in donors}
        best = max(donors, key=lambda d: reuse[d.id])
        if reuse[best.id] < MIN_COPY_TOKENS:
            return [], 0, -1
        n = min(common_prefix(best.history, prompt), len(prompt) - 1)
        self.cells.copy_from(best, a)
        kept = self.cut(a, n, prompt)
        self.rewind(a, n)
        return kept, n, best.id

"""An agent: one conversation with the model, its history in one KV stream. It owns its state: every change
of it is one of the transitions below, named for what happened (a task begun, a turn ended, a wait for a
tool or for a client, woken, preempted, evicted), so that what an agent can go through is read here, not
gathered from the modules that drive it. Who calls them: its source (engine/agents/workload.py, engine/agents/served.py)
between turns, the engine's step (engine/batch_runner.py, engine/kv/switch.py, engine/kv/residency.py,
engine/scheduler.py) within them."""

import itertools
from dataclasses import dataclass, field
from enum import Enum

from swarmtune.engine.conversation.chat_message import ChatMessage
from swarmtune.engine.conversation.chunk_reuse import KeptChunk, unfold

TAIL_CHARS = 48  # the tail of its text an agent shows
EDITS_KEPT = 16  # how many of its last edits an agent remembers the extent of
_MADE = itertools.count()  # each agent made in this process, numbered: `made`


class AgentState(Enum):
    PREFILL = "prefilling"  # has tokens waiting to be ingested
    DECODE = "decoding"  # ready to generate (it shows as "waiting" when a step leaves it out)
    PREEMPTED = "preempted"  # cache freed; its whole history must be prefilled again
    TOOL = "tool"  # waiting for its tool call to return: out of the batch, its history wherever residency put it
    CLIENT = "client"  # a served agent between turns: waiting for its client's next request


class Residency(Enum):
    CACHE = "cache"  # its history's cells are in the KV cache
    HOST = "host"  # swapped out: its sequence state is in host memory, restored without a re-prefill
    NONE = "none"  # dropped: its history waits in `pending`, to be prefilled again


@dataclass
class Agent:
    id: int
    seq: int  # its sequence id (KV stream) in the backend
    limit: int  # context limit, tokens
    history: list[int] = field(default_factory=list)  # every token in its cache, in order
    pending: list[int] = field(default_factory=list)  # tokens to ingest before it can generate
    state: AgentState = AgentState.PREFILL
    next_token: int | None = None  # sampled, not yet in the cache
    turn_generated: int = 0
    generated: int = 0
    turns: int = 0
    tasks: int = 0
    last_served_step: int = -1
    # the step at which the KV budget last took its cells (-1: never): of the agents not waiting for a tool,
    # the scheduler frees first the one it took most recently (engine/scheduler.py)
    evicted_at: int = -1
    tail: str = ""
    messages: list[ChatMessage] = field(default_factory=list)
    turn_text: str = ""
    # while it waits (TOOL or CLIENT): when what it waits for arrives (the engine's clock; None: not yet known,
    # a client that has not sent its next request), and what arrives, ingested once it does
    tool_ready_at: float | None = None
    tool_pending: list[int] = field(default_factory=list)
    residency: Residency = Residency.CACHE
    swapped: object | None = None  # its sequence state in host memory (the backend's opaque handle)
    label: str = ""  # a served agent: its conversation's key
    reused_tokens: int | None = None  # a served agent: of its last prompt, the tokens whose cells were reused
    miss: str = ""  # a served agent: why its last prompt prefilled what it had held, in short
    queue_s: float | None = None  # a served agent: its request's wait in the queue (measured, seconds)
    ttft_s: float | None = None  # and arrival to its first token, once one came
    kept: list[KeptChunk] = field(default_factory=list)  # cut from its cells, put back as its prefill reaches them
    # every change of what it knows (history + pending) other than tokens added at its end, and of the last
    # few, how many of the tokens it knew each left in place: a prefix index (engine/agents/prefix_index.py)
    # hashes only what an edit changed and what was added since
    edits: int = 0
    intact: list[tuple[int, int]] = field(default_factory=list)
    # which agent this is among all made in this process: an id and a sequence are used again by the next agent
    # (the swarm shrunk and grown), so a cache kept beside the agent's (a draft model's) knows it by this
    made: int = field(default_factory=lambda: next(_MADE))
    # speculation (engine/spec/): tokens it drafted into decode steps since the start, and of those the ones it kept
    drafted: int = 0
    accepted: int = 0

    def _edited(self, intact: int) -> None:
        self.edits += 1
        self.intact.append((self.edits, intact))
        if len(self.intact) > EDITS_KEPT:
            del self.intact[0]

    def intact_since(self, edits: int) -> int | None:
        """How many of the tokens it knew after edit number `edits` every edit since has left in place (tokens
        added since are not counted); None where the edits since are too many to say."""
        since = [n for e, n in self.intact if e > edits]
        return min(since, default=len(self.history) + len(self.pending)) if len(since) == self.edits - edits \
            else None

    @property
    def context(self) -> int:
        return len(self.history)

    @property
    def waiting(self) -> bool:
        """Out of the batch until what it waits for arrives: a tool's result, or its client's next turn."""
        return self.state is AgentState.TOOL or self.state is AgentState.CLIENT

    @property
    def cached_tokens(self) -> int:
        """Tokens it holds in the KV cache now: none while preempted, swapped out or dropped."""
        if self.state is AgentState.PREEMPTED or self.residency is not Residency.CACHE:
            return 0
        return len(self.history)

    # between turns: its source
    def new_task(self) -> None:
        """A task (a synthetic agent's) or a conversation (a served one's) begins: counted, no turn yet."""
        self.tasks += 1
        self.turns = 0

    def start(self, prompt: list[int]) -> None:
        """Its cells are gone (the caller dropped them): it begins again from prompt, to prefill."""
        self.history, self.pending = [], list(prompt)
        self._edited(0)
        self.state = AgentState.PREFILL
        self.next_token, self.turn_generated, self.turn_text = None, 0, ""
        self.tool_ready_at, self.tool_pending = None, []
        self.residency, self.swapped = Residency.CACHE, None

    def turn_ended(self) -> None:
        """It generated its turn (or was stopped): what it sampled last is not in its history."""
        self.turns += 1
        self.turn_generated = 0
        self.turn_text = ""
        self.next_token = None

    def prefill_next(self, tokens: list[int]) -> None:
        """What comes next is known now (a tool result with no wait): prefilled, then it generates."""
        self.pending = tokens
        self._edited(len(self.history))
        self.state = AgentState.PREFILL

    def wait_for_tool(self, result: list[int], ready_at_s: float) -> None:
        self.tool_pending, self.tool_ready_at = result, ready_at_s
        self.state = AgentState.TOOL

    def wait_for_client(self) -> None:
        self.tool_pending, self.tool_ready_at = [], None
        self.state = AgentState.CLIENT

    def client_returned(self, suffix: list[int], kept: list[KeptChunk]) -> None:
        """Its client sent the next turn: the prompt's suffix past what it holds (less the chunks it kept, put
        back as its prefill reaches them) arrives now, and the next step wakes it (its history back first,
        where residency moved it)."""
        self.kept = kept
        self.tool_pending, self.tool_ready_at = suffix, 0.0
        self.turn_generated, self.next_token, self.turn_text = 0, None, ""

    def rewound(self, keep: int) -> None:
        """Only the first `keep` tokens of its conversation stay: its cells past them are gone (the caller
        truncated them), or, dropped, its queued prefill is cut."""
        if self.residency is Residency.CACHE:
            self._edited(min(keep, len(self.history)))
            self.history = self.history[:keep]
            self.pending = []
        else:
            self.pending = self.pending[:keep]
            self._edited(min(keep, len(self.history)))

    def truncated(self, keep: int) -> None:
        """Its cells past `keep` are gone (the caller cut or truncated them)."""
        self._edited(min(keep, len(self.history)))
        self.history = self.history[:keep]

    def copied(self, history: list[int]) -> None:
        """Another agent's cells were copied into its stream (a shared prefix)."""
        self.history = list(history)
        self._edited(0)

    def stopped_midway(self) -> None:
        """Its client left while it prefilled or decoded: it keeps the cells it has, no more."""
        self.next_token = None
        if self.state is AgentState.PREEMPTED:
            self.residency = Residency.NONE  # its history waits in `pending`, as a dropped one's does
        else:
            self.pending = []
        self._edited(len(self.history))

    def due(self, now_s: float) -> bool:
        """What it waits for has arrived."""
        return self.waiting and self.tool_ready_at is not None and self.tool_ready_at <= now_s

    def woken(self) -> None:
        """What it waited for is queued for prefill, after its history where that was dropped."""
        self.pending = self.pending + self.tool_pending
        self.tool_pending, self.tool_ready_at = [], None
        self.residency = Residency.CACHE  # its prefill (history, if dropped, then the result) refills the cells
        self.state = AgentState.PREFILL

    # within a step: the engine
    def prefilled(self, n: int) -> None:
        """The first n of its pending tokens are in its cells now."""
        self.history.extend(self.pending[:n])
        del self.pending[:n]

    def served(self, step: int) -> None:
        """A step served it (the scheduler's rotation: least recently served first)."""
        self.last_served_step = step

    def pasted(self) -> None:
        """The first chunk it kept went back into its cells at its place."""
        k = self.kept.pop(0)
        self._edited(len(self.history))
        self.history.extend(k.tokens)  # inserted before what is still pending

    def decoded(self, fed: int, step: int) -> None:
        """The token it was fed is in its cells; it generated one more."""
        if self.pending:
            self._edited(len(self.history))  # not at the end of what it knows
        self.history.append(fed)
        self.generated += 1
        self.turn_generated += 1
        self.served(step)

    def drafts_verified(self, drafted: int, kept: int) -> None:
        """A step verified `drafted` tokens it drafted (engine/spec/), and its draws agreed with `kept` of them."""
        self.drafted += drafted
        self.accepted += kept

    def ready(self) -> None:
        """Its prefill is done: it generates from the next step."""
        self.state = AgentState.DECODE

    def preempted(self) -> None:
        """Its cells were freed for others: all it held is prefilled again once it is readmitted."""
        self.requeue()
        self.state = AgentState.PREEMPTED

    def readmitted(self) -> None:
        """Its history fits the budget again: it is prefilled whole."""
        self.state = AgentState.PREFILL

    def swapped_out(self, handle: object) -> None:
        self.swapped, self.residency = handle, Residency.HOST

    def swapped_in(self) -> None:
        self.swapped, self.residency = None, Residency.CACHE

    def fold_kept(self) -> None:
        """Its kept chunks are prefilled instead: its cells are gone, or in another cache type."""
        if self.kept:
            self.pending = unfold(len(self.history), self.pending, self.kept)
            self.kept = []
            self._edited(len(self.history))

    def evict(self) -> None:
        """Its cells are gone while it waits: its history will be prefilled again when it runs next."""
        self.fold_kept()
        self.pending = self.history + self.pending
        self.history = []
        self.residency = Residency.NONE
        self.swapped = None

    def requeue(self) -> None:
        """Its cache is gone: everything it held (and its sampled next token) must be prefilled again."""
        self.fold_kept()
        self.pending = self.history + self.pending + ([self.next_token] if self.next_token is not None else [])
        self.history = []
        self.next_token = None

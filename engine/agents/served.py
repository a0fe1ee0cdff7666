"""Agents whose turns arrive as HTTP requests: every conversation is an agent, and its cache outlives
its request.

A request's prompt tokens are matched against every waiting agent's history: one that begins with a
history continues that agent (only the new suffix is prefilled). Any other takes a free agent, or
displaces the least recently used waiting one, and copies the cells of the longest prefix another agent
holds (the same system prompt and tools, or the conversation it edits or trims) rather than prefilling
them: a sub-agent never costs its parent's cache. Where the agent it displaces is the conversation it
edits, it keeps their common prefix and drops the rest of that sequence's cells, never the whole
cache. An explicit key pins a conversation to its agent.

Requests arrive on the server's threads and wait in a bounded queue in arrival order; they reach agents
only in `before_step`, on the engine's thread, so nothing else ever touches an agent. Between its reply
and its next request an agent waits for its client (the synthetic swarm's tool state), and residency
decides where its history lives meanwhile."""

import math
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from swarmtune.engine.agents.agent import TAIL_CHARS, Agent, AgentState, Residency
from swarmtune.engine.agents.agent_source import TrafficShape
from swarmtune.engine.agents.cells import Cells
from swarmtune.engine.backends.backend import Backend
from swarmtune.engine.conversation import cache_miss, chunk_reuse
from swarmtune.engine.conversation.cache_miss import CacheMiss
from swarmtune.engine.conversation.chunk_reuse import KeptChunk
from swarmtune.engine.conversation.sampling import SamplingParams
from swarmtune.engine.conversation.text_stream import TextStream
from swarmtune.engine.measure.energy_share import joules_by_agent
from swarmtune.engine.records import RequestRecord, StepRecord

# A shared prefix shorter than this is prefilled. A copy between streams moves the whole stream, but cheaply:
# measured on the default model (bench/prefix_copy.py, 2-core CPU, f16, 2,048 cells), the first token after
# a copy came 0.24x as late as after prefilling a 32-token prefix, 0.064x at 256, 0.039x at 1,024
MIN_COPY_TOKENS = 16
SHAPE_TURNS = 64  # the traffic's shape (what a turn generates, adds, waits) is the median of this many turns
# displaced conversations remembered, to say so when one comes back: each new conversation is compared with
# them token by token on the engine's thread, as with every free agent, so they are few
DISPLACED_KEPT = 16
# a waiting conversation is expected back within this many of its usual gaps (plus a grace for a client's
# own work); past that the worth of its cells fades, as a finished conversation's should
RETURN_GAPS, RETURN_GRACE_S = 4, 2.0


class Busy(Exception):
    """Every agent is busy and the queue is full: the client should come back later."""

    def __init__(self, queued: int, retry_after_s: int, why: str = "") -> None:
        super().__init__(why or f"all agents are busy and {queued} requests are queued; retry in {retry_after_s} s")
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class Delta:
    """Text for the client: whole characters, never a stop sequence's start."""

    text: str


@dataclass(frozen=True)
class Finished:
    reason: str  # stop | length | cancelled
    usage: Usage
    stop_sequence: str | None = None  # the one it stopped at, if a stop sequence ended it


@dataclass(frozen=True)
class Closed:
    """The server stops before the reply ends: the client gets an error, not a reply cut short as if whole."""

    message: str


@dataclass(eq=False)
class ServedRequest:
    prompt: list[int]
    max_tokens: int
    params: SamplingParams
    stop: tuple[str, ...] = ()
    key: str | None = None  # pins the conversation to an agent (the request's `user`, or a header)
    endpoint: str = "chat"
    # called on the engine's thread (close_all: any thread); never blocks
    emit: Callable[[Delta | Finished | Closed], None] = lambda event: None
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    arrival: float = field(default_factory=time.perf_counter)
    cancelled: bool = False  # set by the server's thread when the client leaves
    # the engine's thread fills these in
    agent: int = -1
    assigned: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    token_gaps_s: list[float] = field(default_factory=list)
    cached_tokens: int = 0
    prefilled_tokens: int = 0
    copied_tokens: int = 0  # of cached_tokens, the cells copied from another agent's
    copied_from: int = -1  # that agent
    shifted_tokens: int = 0  # of cached_tokens, the cells kept past a divergence, shifted into place
    miss: CacheMiss | None = None  # why it prefilled what its conversation had held, or that it is new
    system_tokens: int = 0  # where the system prompt ends in `prompt` (0: unknown)
    prefill_s: float = 0.0  # the seconds of the steps it was in, by kind
    decode_s: float = 0.0
    joules: float | None = None  # its share of those steps' energy
    power_source: str = ""
    completion_tokens: int = 0
    generated: list[int] = field(default_factory=list)  # the tokens whose text was sent
    finish_reason: str | None = None
    text: TextStream = field(init=False)
    prompt_tokens: int = field(init=False)  # as the client sent it (`prompt` grows if it moves to another agent)

    def __post_init__(self) -> None:
        self.text = TextStream(self.stop)
        self.prompt_tokens = len(self.prompt)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _bucket(x: float) -> int:
    """A median rounded to a step of about 25%, so the shape changes only when the traffic does."""
    if x <= 1:
        return 1
    return max(1, round(1.25 ** round(math.log(x) / math.log(1.25))))


class ServedAgents:
    def __init__(self, backend: Backend, max_queue: int = 64, copy_prefix: bool = True,
                 on_finish: Callable[[ServedRequest, RequestRecord], None] | None = None,
                 cache_reuse: int = chunk_reuse.DEFAULT_MIN_TOKENS) -> None:
        self.backend = backend
        self.cells = Cells(backend)  # its agents' cells are edited only through it
        self.max_queue = max_queue
        self.copy_prefix = copy_prefix
        self.cache_reuse = cache_reuse  # the shortest run of old cells kept past a divergence; 0: off
        # what a kept chunk saves and costs here, measured as the server runs (None: not yet seen): a chunk is
        # kept only where prefilling it would take longer than putting it back (engine/conversation/chunk_reuse.py)
        self._prefill_s_per_token: float | None = None
        self._paste_s_per_cell: float | None = None
        self.on_finish = on_finish or (lambda req, rec: None)
        self._queue: deque[ServedRequest] = deque()
        self._closing = False
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._records: deque[RequestRecord] = deque(maxlen=4096)  # until drained
        self._ending: list[tuple[ServedRequest, RequestRecord]] = []  # closed this step: its energy comes after
        # the engine's thread only, from here on
        self._active: dict[int, ServedRequest] = {}  # agent id -> the request it serves
        self._keys: dict[int, str] = {}  # agent id -> its conversation's key
        self._last_used: dict[int, float] = {}
        self._replied_at: dict[int, float] = {}
        self._gap_s: dict[int, float] = {}  # agent id -> how long its conversation tends to take to come back
        self._prompt_end: dict[int, int] = {}  # agent id -> the length of the last prompt it took
        # conversations displaced from their agent, newest last: (their tokens, who displaced them), so that
        # one coming back can be told it was displaced rather than new
        self._displaced: deque[tuple[list[int], str]] = deque(maxlen=DISPLACED_KEPT)
        self._agents: list[Agent] = []
        self._gen: deque[int] = deque(maxlen=SHAPE_TURNS)
        self._added: deque[int] = deque(maxlen=SHAPE_TURNS)
        self._waits: deque[float] = deque(maxlen=SHAPE_TURNS)
        self.busy_agents = 0  # read by /metrics and the dashboard's status line
        self._shape: TrafficShape | None = None

    # the server's threads
    def submit(self, req: ServedRequest) -> None:
        """Queue a request (any thread). Busy when the queue is full, or the server is closing. A request
        waits in the queue until the engine's next step gives it an agent, so the queue holds the agents
        free now on top of max_queue: a burst on an idle server is admitted up to both."""
        with self._lock:
            if self._closing:
                raise Busy(0, retry_after_s=5, why="the server is shutting down")
            free = max(0, len(self._agents) - self.busy_agents)  # as the engine's last step left them
            if len(self._queue) >= self.max_queue + free:
                raise Busy(len(self._queue), retry_after_s=1)
            self._queue.append(req)
        self._wake.set()

    def close_all(self, message: str = "the server is shutting down") -> None:
        """Any thread, as the server stops: every queued and running request ends now with an error, so no
        client waits on a reply that will not come and the server's connections close at once."""
        with self._lock:
            self._closing = True
            reqs = list(self._queue) + list(self._active.values())
            self._queue.clear()
        for req in reqs:
            req.cancelled = True
            req.emit(Closed(message))
        self._wake.set()

    def cancel(self, req: ServedRequest) -> None:
        """Its client left (any thread): it ends within a step, its agent keeps what it had."""
        req.cancelled = True
        self._wake.set()

    @property
    def queued(self) -> int:
        return len(self._queue)

    def drain_records(self) -> list[RequestRecord]:
        with self._lock:
            out = list(self._records)
            self._records.clear()
        return out

    def traffic(self) -> TrafficShape | None:
        """The traffic's shape once a few turns have ended; None before. The engine asks every step: it is
        worked out only when a turn ends or returns (_reshape)."""
        return self._shape

    def _reshape(self) -> None:
        if len(self._gen) < 4:
            return
        med = _median
        self._shape = TrafficShape(_bucket(med(self._gen)), _bucket(med(self._added)) if self._added else 1,
                                   round(med(self._waits), 1) if self._waits else 0.0)

    # the engine's thread (engine/agents/agent_source.py)
    def start_task(self, agent: Agent) -> None:
        """A new agent, or one whose conversation was displaced: empty, waiting for a client."""
        if all(a is not agent for a in self._agents):
            # counted as free from now: before the engine's first step (which hands over its own list) a
            # burst would otherwise meet no free agent and get a 503 past max_queue alone
            self._agents.append(agent)
        self.cells.restart(agent, [])
        agent.wait_for_client()
        agent.label, agent.reused_tokens, agent.tail, agent.miss = "", None, "", ""
        self._keys.pop(agent.id, None)
        self._prompt_end.pop(agent.id, None)
        self._gap_s.pop(agent.id, None)
        agent.new_task()

    def seed_sampler(self, agent: Agent) -> None:
        req = self._active.get(agent.id)
        self.backend.set_sampler(agent.seq, req.params if req is not None else SamplingParams(seed=agent.id))

    def turn_limit(self, agent: Agent) -> int:
        req = self._active.get(agent.id)
        return req.max_tokens if req is not None else 1

    def idle(self, seconds: float) -> None:
        self._wake.wait(seconds)
        self._wake.clear()

    def on_token(self, agent: Agent, token: int, piece: str) -> bool:
        req = self._active.get(agent.id)
        if req is None:
            return False
        if req.cancelled:
            return False  # end_turn closes it
        now = time.perf_counter()
        if req.first_token is None:
            req.first_token = now
        elif req.last_token is not None:
            req.token_gaps_s.append(now - req.last_token)
        req.last_token = now
        req.completion_tokens += 1
        req.generated.append(token)
        text = req.text.feed(self.backend.token_bytes(token))
        if text:
            req.emit(Delta(text))
            agent.tail = (agent.tail + text)[-TAIL_CHARS:]
        if req.text.stopped:
            req.finish_reason = "stop"
            return False
        if req.completion_tokens >= req.max_tokens:
            # its text is sent; the token is in the next prompt, so the batch needs no step to cache it
            req.finish_reason = "length"
            return False
        return True

    def end_turn(self, agent: Agent, now_s: float) -> None:
        req = self._active.pop(agent.id, None)
        agent.turn_ended()
        agent.wait_for_client()
        if req is None:
            return
        if req.cancelled:
            reason = "cancelled"
        elif req.finish_reason is not None:
            reason = req.finish_reason
        else:  # the end of generation, or the context's limit
            reason = "length" if agent.context + 2 >= agent.limit else "stop"
        self._close(req, reason, now_s)
        self._gen.append(req.completion_tokens)
        self._reshape()
        self._replied_at[agent.id] = time.perf_counter()
        self._last_used[agent.id] = time.perf_counter()

    def before_step(self, agents: list[Agent], now_s: float) -> None:
        self._agents = agents
        by_id = {a.id: a for a in agents}
        for aid in [i for i in self._active if i not in by_id]:
            self._requeue(self._active.pop(aid))  # its agent was removed (fewer agents): it goes on elsewhere
        for aid in [i for i in self._keys if i not in by_id]:
            del self._keys[aid]
        for a in agents:
            req = self._active.get(a.id)
            if req is not None and req.cancelled and not a.waiting:
                a.stopped_midway()
                self.end_turn(a, now_s)
        with self._lock:
            waiting = list(self._queue)
        taken: list[ServedRequest] = []
        for req in waiting:
            if req.cancelled:
                taken.append(req)
                self._close(req, "cancelled", now_s)
                continue
            picked = self._pick(agents, req)
            if picked is None:
                if req.key is not None:
                    continue  # its own agent is busy: it waits, the others go on
                break
            self._assign(picked[0], picked[1], req)
            taken.append(req)
        if taken:
            with self._lock:
                gone = set(map(id, taken))
                self._queue = deque(r for r in self._queue if id(r) not in gone)
        self.busy_agents = len(self._active)

    # which agent a request continues
    def _idle(self, agents: list[Agent]) -> list[Agent]:
        return [a for a in agents if a.id not in self._active and a.state is AgentState.CLIENT
                and a.tool_ready_at is None and a.seq < self.backend.n_seqs]

    @staticmethod
    def _known(a: Agent) -> list[int]:
        """The tokens its conversation holds: cached, swapped out, or waiting to be prefilled again."""
        return a.history + a.pending

    def _pick(self, agents: list[Agent], req: ServedRequest) -> tuple[Agent, bool] | None:
        """The agent for req, and whether req continues its conversation (else it displaces it)."""
        idle = self._idle(agents)
        if req.key is not None:
            own = [a for a in agents if self._keys.get(a.id) == req.key]
            if own:
                return (own[0], True) if own[0] in idle else None
        free = [a for a in idle if req.key is None or a.id not in self._keys]
        if not free:
            return None
        best = max(free, key=lambda a: (common_prefix(self._known(a), req.prompt), -a.id))
        n = common_prefix(self._known(best), req.prompt)
        if n and (n == len(self._known(best)) or n >= self._prompt_end.get(best.id, n + 1)):
            # its continuation: the whole history, or all of its last prompt and a reply the client rendered
            # back in other tokens (the end of a reply often tokenizes otherwise once it is followed by text)
            return best, True
        # an edited or trimmed conversation, or a new one: a free agent, which copies the prefix it shares with
        # any agent; the old conversation stays whole for its own return
        empty = [a for a in free if not self._known(a)]
        if empty:
            return min(empty, key=lambda a: a.id), True
        victim = self._victim(free)
        r = self._reusable(self._known(victim), req.prompt)
        if r >= MIN_COPY_TOKENS and r >= self._shared_prefix(req, but=victim):
            # the conversation it would displace is the one it edits (not one that shares no more than a chat
            # template's first tokens, or less than a copy from another agent would give): keep what it can
            return victim, True
        return victim, False

    def _victim(self, free: list[Agent]) -> Agent:
        """The waiting conversation whose cells are worth least: its own cells (what no copy of another
        agent's could give back: a sub-agent's are mostly its parent's prompt), discounted once it has
        waited well past the gap after which it usually comes back (a finished conversation fades). The
        least recently used breaks ties: with nothing learnt yet, the rule is LRU."""
        now = time.perf_counter()
        typical = _median(self._waits) if self._waits else None

        def value(a: Agent) -> tuple[float, float, int]:
            held = self._known(a)
            own = len(held) - max((common_prefix(d.history, held) for d in self._donors(a)), default=0)
            gap = self._gap_s.get(a.id, typical)
            waited = now - self._replied_at.get(a.id, self._last_used.get(a.id, now))
            patience = RETURN_GAPS * gap + RETURN_GRACE_S if gap is not None else None
            likely = 1.0 if patience is None or waited <= patience else patience / waited
            return own * likely, self._last_used.get(a.id, 0.0), a.id

        return min(free, key=value)

    def _assign(self, a: Agent, continues: bool, req: ServedRequest) -> None:
        gone = (self._known(a), a.label) if not continues and self._known(a) else None
        if not continues:
            self.start_task(a)
        held = self._known(a)
        keep = common_prefix(held, req.prompt)
        if a.id in self._replied_at and keep:
            gap = time.perf_counter() - self._replied_at.pop(a.id)
            self._waits.append(gap)
            self._gap_s[a.id] = _ema(self._gap_s.get(a.id), gap, 0.5)
            self._added.append(len(req.prompt) - keep)
            self._reshape()
        dropped = a.residency is Residency.NONE and keep > 0
        keep_all = keep
        keep = min(keep, len(req.prompt) - 1)  # at least one token is prefilled: the next token samples from it
        kept = self._cut(a, keep, req)
        self._rewind(a, keep)
        if not a.history and not a.pending and not kept and self.copy_prefix:
            kept = self._copy_shared_prefix(a, req)
        req.cached_tokens = len(a.history) if a.residency is not Residency.NONE else 0
        req.shifted_tokens = sum(len(k.tokens) for k in kept)
        req.cached_tokens += req.shifted_tokens
        req.prefilled_tokens = len(req.prompt) - req.cached_tokens
        req.agent, req.assigned = a.id, time.perf_counter()
        self._active[a.id] = req
        self._last_used[a.id] = req.assigned
        if req.key is not None:
            self._keys[a.id] = req.key
        a.label = req.key or self._keys.get(a.id, "") or f"conversation {a.tasks}"
        req.miss = self._why(a, held, keep_all, req, dropped)
        if req.miss is not None and req.shifted_tokens:
            req.miss = cache_miss.kept_by_shift(req.miss, req.shifted_tokens, req.prefilled_tokens)
        if gone is not None:
            self._displaced.append((gone[0], a.label))
        self._prompt_end[a.id] = len(req.prompt)
        a.reused_tokens = req.cached_tokens
        a.miss = cache_miss.short(req.miss, req.shifted_tokens, req.prefilled_tokens) if req.miss else ""
        a.client_returned(self._to_prefill(req.prompt, len(self._known(a)), kept), kept)
        self.backend.set_sampler(a.seq, req.params)

    def _why(self, a: Agent, held: list[int], keep: int, req: ServedRequest, dropped: bool) -> CacheMiss | None:
        """Why req prefilled what its conversation had held (None: nothing but its new suffix)."""
        if dropped:
            return cache_miss.dropped(req.cached_tokens)
        if held:
            return self._diverged(a, held, keep, req) if keep < len(held) else None
        if (back := self._came_back(req)) is not None:
            return back
        donor = next((d for d in self._agents if d.id == req.copied_from), None)
        if donor is not None and 0 < req.system_tokens and req.copied_tokens > req.system_tokens + MIN_COPY_TOKENS:
            # it shares more than the system prompt (and the next message's header) with another conversation:
            # that one, edited (it stays whole on its agent for its own return)
            m = cache_miss.diverged(self._known(donor), req.prompt, req.copied_tokens, req.system_tokens, self._text)
            cause, _, then = m.words.partition(": ")
            return replace(m, words=f"{cause} ({req.copied_tokens:,} tokens copied from agent {donor.id}, whose "
                                    f"conversation stays whole): {then}")
        return cache_miss.new_conversation(req.copied_tokens, f"agent {req.copied_from}")

    def _diverged(self, a: Agent, held: list[int], keep: int, req: ServedRequest) -> CacheMiss | None:
        """Why a continuing conversation's prompt left its history at `keep` (None: only the one token
        every turn prefills)."""
        if keep >= len(req.prompt) - 1:
            return None
        text = self._text
        end = self._prompt_end.get(a.id)
        if end is not None and keep >= end:
            n = len(held) - keep
            return CacheMiss(keep, "reply", f"the client sent the last reply back in other tokens: its last {n:,} "
                             "tokens prefilled again", text(held[keep : keep + cache_miss.EXCERPT_TOKENS]),
                             text(req.prompt[keep : keep + cache_miss.EXCERPT_TOKENS]))
        return cache_miss.diverged(held, req.prompt, keep, req.system_tokens, text)

    def _text(self, tokens: Sequence[int]) -> str:
        return b"".join(self.backend.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")

    def _came_back(self, req: ServedRequest) -> CacheMiss | None:
        """A conversation displaced earlier that comes back: it matches one further than any agent does."""
        best, by = 0, ""
        for tokens, who in self._displaced:
            n = common_prefix(tokens, req.prompt)
            if n > best:
                best, by = n, who
        if best <= max(req.copied_tokens, MIN_COPY_TOKENS):
            return None
        return cache_miss.displaced(req.copied_tokens, by)

    def _cut(self, a: Agent, keep: int, req: ServedRequest) -> list[KeptChunk]:
        """Past the divergence, runs of its old cells that reappear later in the prompt are cut out to be
        put back shifted (engine/conversation/chunk_reuse.py) rather than prefilled; the rest of its cells go."""
        held = a.history
        if (self.cache_reuse <= 0 or a.residency is not Residency.CACHE or a.pending or keep >= len(held)
                or self.backend.why_no_shift() is not None):
            return []
        chunks = self._plan(held, req.prompt, keep)
        if not chunks:
            return []
        handles = self.cells.cut(a, keep, chunks)
        return [KeptChunk(c.prompt_at, tuple(req.prompt[c.prompt_at : c.prompt_at + c.tokens]), h)
                for c, h in zip(chunks, handles, strict=False)]

    @staticmethod
    def _to_prefill(prompt: list[int], start: int, kept: list[KeptChunk]) -> list[int]:
        """prompt from start, less the kept chunks' tokens."""
        out: list[int] = []
        at = start
        for k in kept:
            out += prompt[at : k.at]
            at = k.at + len(k.tokens)
        return out + prompt[at:]

    def _rewind(self, a: Agent, keep: int) -> None:
        """Keep only the first `keep` tokens of its conversation."""
        if keep >= len(self._known(a)):
            return
        self.cells.continue_from(a, keep)

    def _donors(self, a: Agent) -> list[Agent]:
        return [d for d in self._agents if d is not a and d.residency is Residency.CACHE and d.history
                and d.state is not AgentState.PREEMPTED and d.seq < self.backend.n_seqs]

    def _reusable(self, held: list[int], prompt: list[int]) -> int:
        """How many of prompt's tokens held's cells would give: the common prefix, and with --cache-reuse the
        chunks after it (versions of one conversation share a prefix; the latest shares the most after it)."""
        n = min(common_prefix(held, prompt), len(prompt) - 1)
        if self.cache_reuse <= 0 or self.backend.why_no_shift() is not None:
            return n
        return n + sum(c.tokens for c in self._plan(held, prompt, n))

    def _plan(self, held: list[int], prompt: list[int], keep: int) -> list[chunk_reuse.Chunk]:
        """The chunks --cache-reuse keeps, less those whose paste (the sequence up to its end saved and set
        again) costs more than their prefill, as both were last measured here."""
        chunks = chunk_reuse.plan(held, prompt, keep, self.cache_reuse)
        pre, paste = self._prefill_s_per_token, self._paste_s_per_cell
        if pre is None or paste is None:
            return chunks
        return [c for c in chunks if c.tokens * pre > (c.prompt_at + c.tokens) * paste]

    def _shared_prefix(self, req: ServedRequest, but: Agent) -> int:
        """The most of req's prompt a copy of another agent's cells would give."""
        return max((self._reusable(d.history, req.prompt) for d in self._donors(but)), default=0)

    def _copy_shared_prefix(self, a: Agent, req: ServedRequest) -> list[KeptChunk]:
        """A new conversation that begins as another agent's does (a system prompt, tool definitions; or
        that agent's conversation, edited or trimmed): copy those cells rather than prefill them, and the
        chunks of the rest that reappear later in the prompt (the copy moves the whole stream anyway)."""
        donors = self._donors(a)
        if not donors:
            return []
        reuse = {d.id: self._reusable(d.history, req.prompt) for d in donors}
        best = max(donors, key=lambda d: reuse[d.id])
        if reuse[best.id] < MIN_COPY_TOKENS:
            return []
        n = min(common_prefix(best.history, req.prompt), len(req.prompt) - 1)
        self.cells.copy_from(best, a)
        kept = self._cut(a, n, req)
        self._rewind(a, n)
        req.copied_tokens, req.copied_from = n, best.id
        return kept

    def _requeue(self, req: ServedRequest) -> None:
        """Its agent is gone: the request goes on from where it was, on another agent, at the queue's head:
        its prompt grows by what it generated, so the client sees no token twice."""
        req.prompt = req.prompt[: req.prompt_tokens] + req.generated
        req.agent = -1
        with self._lock:
            self._queue.appendleft(req)

    def _close(self, req: ServedRequest, reason: str, now_s: float) -> None:
        if req.finish_reason is None or reason == "cancelled":
            req.finish_reason = reason
        rest = req.text.finish()
        if rest:
            req.emit(Delta(rest))
        usage = Usage(req.prompt_tokens, req.completion_tokens, req.cached_tokens)
        req.emit(Finished(req.finish_reason, usage, req.text.matched))
        end = time.perf_counter()
        rec = RequestRecord(
            id=req.id, t=round(now_s, 6), agent=req.agent, key=req.key or "",
            queue_s=round((req.assigned or end) - req.arrival, 6), prompt_tokens=req.prompt_tokens,
            cached_tokens=req.cached_tokens, prefilled_tokens=req.prefilled_tokens,
            ttft_s=round(req.first_token - req.arrival, 6) if req.first_token is not None else None,
            completion_tokens=req.completion_tokens, finish_reason=req.finish_reason,
            e2e_s=round(end - req.arrival, 6), endpoint=req.endpoint, copied_tokens=req.copied_tokens,
            copied_from=req.copied_from, shifted_tokens=req.shifted_tokens,
        )
        if (m := req.miss) is not None:
            rec = replace(rec, miss_at=m.at, miss_cause=m.cause, miss_words=m.words, miss_old=m.old, miss_new=m.new)
        # the step that ended it has no record yet (its seconds and energy): finished in on_record
        self._ending.append((req, rec))

    def on_record(self, step: StepRecord) -> None:
        """After every step: each request in it is charged the step's seconds and its share of the energy;
        the requests that ended in it are then written."""
        if step.kind == "prefill" and step.tokens > 0 and step.seconds > 0:
            self._prefill_s_per_token = _ema(self._prefill_s_per_token, step.seconds / step.tokens)
        for m in step.moved:
            if m.op == "paste" and m.cells > 0:
                self._paste_s_per_cell = _ema(self._paste_s_per_cell, m.seconds / m.cells)
        shares = joules_by_agent(step)
        in_step = set(step.batch_ids)
        # an ended request whose agent another request has taken since (a cancelled one, closed before the
        # step) was not in this step: the step is the new request's
        ended = [r for r, _ in self._ending if r.agent not in self._active]
        for req in [*self._active.values(), *ended]:
            if req.agent not in in_step:
                continue
            if step.kind == "prefill":
                req.prefill_s += step.seconds
            elif step.kind == "decode":
                req.decode_s += step.seconds
            if req.agent in shares:
                req.joules = (req.joules or 0.0) + shares[req.agent]
                req.power_source = step.power_source or ""
        ending, self._ending = self._ending, []
        for req, rec in ending:
            rec = replace(rec, prefill_s=round(req.prefill_s, 6), decode_s=round(req.decode_s, 6),
                          joules=None if req.joules is None else round(req.joules, 6), power_source=req.power_source)
            with self._lock:
                self._records.append(rec)
            self.on_finish(req, rec)


def _ema(old: float | None, new: float, weight: float = 0.2) -> float:
    return new if old is None else old + weight * (new - old)


def _median(xs: "deque[int] | deque[float]") -> float:
    s = sorted(xs)
    return float(s[len(s) // 2])

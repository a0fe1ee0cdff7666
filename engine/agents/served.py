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

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from swarmtune.engine.agents.agent import TAIL_CHARS, Agent, AgentState, Residency
from swarmtune.engine.agents.agent_source import TrafficShape
from swarmtune.engine.agents.cell_reuse import MIN_COPY_TOKENS, CellReuse, known, to_prefill
from swarmtune.engine.agents.cells import Cells
from swarmtune.engine.agents.conversation import Conversation, Conversations
from swarmtune.engine.agents.miss_reasons import MissReasons
from swarmtune.engine.agents.prefix_index import PromptHashes
from swarmtune.engine.agents.served_request import (
    Busy,
    Closed,
    Delta,
    Finished,
    ServedRequest,
    Usage,
    request_record,
)
from swarmtune.engine.agents.traffic_watch import TrafficWatch
from swarmtune.engine.backends.backend import Backend
from swarmtune.engine.conversation import cache_miss, chunk_reuse
from swarmtune.engine.conversation.sampling import SamplingParams
from swarmtune.engine.conversation.token_hashes import common_prefix
from swarmtune.engine.measure.energy_share import joules_by_agent
from swarmtune.engine.record.records import RequestLatency, RequestRecord, StepRecord


def least_worth(free: list[Agent], own_tokens: dict[int, int], typical_s: float | None,
                conversations: dict[int, Conversation]) -> Agent:
    """The waiting conversation whose cells are worth least: its own cells (what no copy of another agent's
    could give back: a sub-agent's are mostly its parent's prompt), discounted once it has waited well past
    the gap after which it usually comes back (a finished conversation fades). The least recently used breaks
    ties: with nothing learnt yet, the rule is LRU."""
    now = time.perf_counter()

    def value(a: Agent) -> tuple[float, float, int]:
        c = conversations.get(a.id) or Conversation()
        return own_tokens[a.id] * c.likely_back(typical_s, now), c.last_used or 0.0, a.id

    return min(free, key=value)


class ServedAgents:
    def __init__(self, backend: Backend, max_queue: int = 64, copy_prefix: bool = True,
                 on_finish: Callable[[ServedRequest, RequestRecord], None] | None = None,
                 cache_reuse: int = chunk_reuse.DEFAULT_MIN_TOKENS) -> None:
        self.backend = backend
        self.cells = Cells(backend)  # its agents' cells are edited only through it
        self.max_queue = max_queue
        self.reuse = CellReuse(backend, self.cells, cache_reuse, copy_prefix)  # what of a prompt cells give
        self.misses = MissReasons(backend)  # why a prompt prefilled what its conversation had held
        self.on_finish = on_finish or (lambda req, rec: None)
        self._queue: deque[ServedRequest] = deque()
        self._closing = False
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._records: deque[RequestRecord] = deque(maxlen=4096)  # until drained
        self._ending: list[tuple[ServedRequest, RequestRecord]] = []  # closed this step: its energy comes after
        # the engine's thread only, from here on
        self.conversations = Conversations()  # agent id -> its conversation (conversation.py)
        self._agents: list[Agent] = []
        self.watch = TrafficWatch()
        self.busy_agents = 0  # read by /metrics and the dashboard's status line

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
        """Any thread, as the server stops: every queued and running request ends now with an error: no
        client waits on a reply that will not come."""
        with self._lock:
            self._closing = True
            reqs = list(self._queue) + self.conversations.serving()
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
        return self.watch.shape

    # the engine's thread (engine/agents/agent_source.py)
    def start_task(self, agent: Agent) -> None:
        """A new agent, or one whose conversation was displaced: empty, waiting for a client."""
        if all(a is not agent for a in self._agents):
            # free from now: before the engine's first step hands over its list, a burst met no free agent
            self._agents.append(agent)
        self.cells.restart(agent, [])
        agent.wait_for_client()
        agent.label, agent.reused_tokens, agent.tail, agent.miss = "", None, "", ""
        self.conversations.of(agent.id).forget()
        agent.new_task()

    def seed_sampler(self, agent: Agent) -> None:
        req = self.conversations.request(agent.id)
        self.backend.steps.set_sampler(agent.seq, req.params if req is not None else SamplingParams(seed=agent.id))

    def turn_limit(self, agent: Agent) -> int:
        req = self.conversations.request(agent.id)
        return req.max_tokens if req is not None else 1

    def idle(self, seconds: float) -> None:
        self._wake.wait(seconds)
        self._wake.clear()

    def on_token(self, agent: Agent, token: int, piece: str) -> bool:
        req = self.conversations.request(agent.id)
        if req is None:
            return False
        if req.cancelled:
            return False  # end_turn closes it
        req.took(token, time.perf_counter())
        if req.completion_tokens == 1 and req.first_token is not None:
            agent.ttft_s = round(req.first_token - req.arrival, 6)
        text = req.text.feed(self.backend.text.token_bytes(token))
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
        req = self.conversations.take_request(agent.id)
        agent.turn_ended()
        agent.wait_for_client()
        if req is None:
            return
        req.drafts_end = (agent.drafted, agent.accepted)
        if req.cancelled:
            reason = "cancelled"
        elif req.finish_reason is not None:
            reason = req.finish_reason
        else:  # the end of generation, or the context's limit
            reason = "length" if agent.context + 2 >= agent.limit else "stop"
        self._close(req, reason, now_s)
        self.watch.turn_ended(req.completion_tokens)
        self.conversations.of(agent.id).replied()

    def before_step(self, agents: list[Agent], now_s: float) -> None:
        self._agents = agents
        by_id = {a.id: a for a in agents}
        for aid in [i for i in self.conversations if i not in by_id]:
            req = self.conversations.pop(aid).request  # its agent was removed (fewer agents)
            if req is not None:
                self._requeue(req)  # it goes on elsewhere
        for a in agents:
            req = self.conversations.request(a.id)
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
            self._assign(picked[0], picked[1], req, picked[2])
            taken.append(req)
        if taken:
            with self._lock:
                gone = set(map(id, taken))
                self._queue = deque(r for r in self._queue if id(r) not in gone)
        self.busy_agents = len(self.conversations.serving())

    # which agent a request continues
    def _idle(self, agents: list[Agent]) -> list[Agent]:
        return [a for a in agents if self.conversations.request(a.id) is None and a.state is AgentState.CLIENT
                and a.tool_ready_at is None and a.seq < self.backend.n_seqs]

    def _pick(self, agents: list[Agent], req: ServedRequest) -> tuple[Agent, bool, PromptHashes | None] | None:
        """The agent for req, whether req continues its conversation (else it displaces it), its hashes."""
        idle = self._idle(agents)
        if req.key is not None:
            own = [a for a in agents if self.conversations.key(a.id) == req.key]
            if own:
                return (own[0], True, None) if own[0] in idle else None
        free = [a for a in idle if req.key is None or self.conversations.key(a.id) is None]
        if not free:
            return None
        p = self.reuse.hashed(req.prompt, agents)
        best = self.reuse.longest_prefix(p, free)
        n = common_prefix(known(best), req.prompt)
        end = self.conversations.of(best.id).prompt_end
        if n and (n == len(known(best)) or n >= (end if end is not None else n + 1)):
            # its continuation: the whole history, or all of its last prompt and a reply the client rendered
            # back in other tokens (the end of a reply often tokenizes otherwise once it is followed by text)
            return best, True, p
        # an edited or trimmed conversation, or a new one: a free agent, which copies the prefix it shares with
        # any agent; the old conversation stays whole for its own return
        empty = [a for a in free if not a.history and not a.pending]
        if empty:
            return min(empty, key=lambda a: a.id), True, p
        victim = self._victim(free)
        r = self.reuse.reusable(victim, p)
        if r >= MIN_COPY_TOKENS and r >= self.reuse.shared_prefix(p, victim, self._agents):
            # the conversation it would displace is the one it edits (not one that shares no more than a chat
            # template's first tokens, or less than a copy from another agent would give): keep what it can
            return victim, True, p
        return victim, False, p

    def _victim(self, free: list[Agent]) -> Agent:
        return least_worth(free, self.reuse.own_tokens(free, self._agents), self.watch.typical_wait_s(),
                           self.conversations)

    def _assign(self, a: Agent, continues: bool, req: ServedRequest, p: PromptHashes | None) -> None:
        gone = (known(a), a.label) if not continues and known(a) else None
        if not continues:
            self.start_task(a)
        held = known(a)
        keep = common_prefix(held, req.prompt)
        conv = self.conversations.of(a.id)
        if keep and (gap := conv.came_back()) is not None:
            self.watch.came_back(gap, len(req.prompt) - keep)
        dropped = a.residency is Residency.NONE and keep > 0
        keep_all = keep
        keep = min(keep, len(req.prompt) - 1)  # at least one token is prefilled: the next token samples from it
        kept = self.reuse.cut(a, keep, req.prompt, self.reuse.known_runs(a, keep, p) if p and continues else None)
        self.reuse.rewind(a, keep)
        if not a.history and not a.pending and not kept:
            p = p or self.reuse.hashed(req.prompt, self._agents)
            kept, req.copied_tokens, req.copied_from = self.reuse.copy_shared_prefix(a, p, self._agents)
        req.cached_tokens = len(a.history) if a.residency is not Residency.NONE else 0
        req.shifted_tokens = sum(len(k.tokens) for k in kept)
        req.cached_tokens += req.shifted_tokens
        req.prefilled_tokens = len(req.prompt) - req.cached_tokens
        req.agent, req.assigned, req.drafts_at = a.id, time.perf_counter(), (a.drafted, a.accepted)
        a.queue_s, a.ttft_s = round(req.assigned - req.arrival, 6), None
        conv.request, conv.last_used = req, req.assigned
        if req.key is not None:
            conv.key = req.key
        a.label = conv.key or f"conversation {a.tasks}"
        req.miss = self.misses.why(held, keep_all, req, dropped, conv.prompt_end, self._agents)
        if req.miss is not None and req.shifted_tokens:
            req.miss = cache_miss.kept_by_shift(req.miss, req.shifted_tokens, req.prefilled_tokens)
        if gone is not None:
            self.misses.displaced.append((gone[0], a.label))
        conv.prompt_end = len(req.prompt)
        a.reused_tokens = req.cached_tokens
        a.miss = cache_miss.short(req.miss, req.shifted_tokens, req.prefilled_tokens) if req.miss else ""
        a.client_returned(to_prefill(req.prompt, len(known(a)), kept), kept)
        self.backend.steps.set_sampler(a.seq, req.params)

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
        # the step that ended it has no record yet (its seconds and energy): finished in on_record
        rec = request_record(req, now_s, time.perf_counter())
        if rec.call_miss:  # the dashboard's agents panel says a turn's call failed, as it says a cache miss
            for a in self._agents:
                if a.id == req.agent:
                    a.miss = f"call unparsed: {rec.call_miss}"[:60]
        self._ending.append((req, rec))

    def on_record(self, step: StepRecord) -> None:
        """After every step: each request in it is charged the step's seconds and its share of the energy;
        the requests that ended in it are then written."""
        self.reuse.learn(step)
        if step.kind == "prefill":  # a prompt's chunk hashed as it goes in, not all at the next placement
            self.reuse.index.sync([a for a in self._agents if a.id in step.batch_ids], complete=False)
        shares = joules_by_agent(step)
        in_step = set(step.batch_ids)
        # an ended request whose agent another request has taken since (a cancelled one, closed before the
        # step) was not in this step: the step is the new request's
        ended = [r for r, _ in self._ending if self.conversations.request(r.agent) is None]
        for req in [*self.conversations.serving(), *ended]:
            if req.agent in in_step:
                req.charge(step, shares.get(req.agent))
        ending, self._ending = self._ending, []
        for req, rec in ending:
            rec = replace(rec, prefill_s=round(req.prefill_s, 6), decode_s=round(req.decode_s, 6),
                          joules=None if req.joules is None else round(req.joules, 6), power_source=req.power_source)
            with self._lock:
                self._records.append(rec)
            self.on_finish(req, rec)
            step.ended.append(RequestLatency(rec.id, rec.agent, rec.queue_s, rec.prefill_time_s, rec.ttft_s, rec.itl_s,
                                             rec.itl_max_s, rec.e2e_s, rec.completion_tokens, rec.family,
                                             rec.reasoning_chars > 0, rec.call_miss))


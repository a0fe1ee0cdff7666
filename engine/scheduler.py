"""Which agents the next step serves: a capped decode batch with fair rotation, prefill chunks, and
preemption when the KV budget cannot hold the step. Pure bookkeeping; it never touches the backend."""

from collections.abc import Callable
from dataclasses import dataclass

from swarmtune.engine.agents.agent import Agent, AgentState
from swarmtune.engine.settings import EngineSettings


@dataclass
class Plan:
    kind: str  # decode | prefill | idle
    agents: list[Agent]
    chunk: int = 0  # prefill: how many of the agent's pending tokens go in this step
    preempt: list[Agent] | None = None  # to free before the step runs
    mixed: Agent | None = None  # decode: the agent whose next `chunk` prefill tokens ride in the same call


class Scheduler:
    def __init__(self, settings: EngineSettings, kv_budget_tokens: Callable[[], int],
                 mix: Callable[[list[Agent], Agent, int], int] | None = None) -> None:
        # the engine's own settings, read at each step (the engine changes them; the scheduler keeps no copy),
        # and what the KV budget holds at the type in force
        self.s = settings
        self._budget = kv_budget_tokens
        # how many of an agent's next chunk a decode batch carries in its own call (engine/spec/mix_policy.py)
        self._mix = mix or (lambda batch, a, chunk: 0)
        self._last_kind = "decode"

    @property
    def chunk_tokens(self) -> int:
        return self.s.chunk_tokens

    @property
    def batch_cap(self) -> int:
        return self.s.batch_cap

    @property
    def kv_budget_tokens(self) -> int:
        return self._budget()

    @staticmethod
    def used_tokens(agents: list[Agent]) -> int:
        return sum(a.cached_tokens for a in agents)

    @staticmethod
    def _victim_order(a: Agent) -> tuple[bool, int, int, int]:
        """Whom to free first when the budget is short: an agent waiting for a tool (it needs no cells
        until its tool returns), then the one whose cells the budget took most recently (it was out once
        already: keeping it out is cheaper than sending out another in its place), then the longest history."""
        return (a.waiting, a.evicted_at, a.context, a.id)

    def _fits_back(self, agents: list[Agent], a: Agent, used: int) -> bool:
        """A history the budget took comes back only once it fits whole with a chunk to spare for it and for
        each agent holding cells. Brought back sooner, the next chunk any of them takes sends another history
        out for it, and that one, back from its tool, sends out a third: on the default model's budget-filling
        workload (8 agents, 2 cores) runs that fell into it prefilled 5,500-7,500 tokens again where runs that
        did not prefilled 4,200-5,700, and ran up to a quarter slower (docs/engine.md). Cells an agent holds
        between a client's requests count as room: a served conversation's next request is not held behind
        idle ones."""
        idle = sum(b.cached_tokens for b in agents if b.state is AgentState.CLIENT)
        holding = sum(1 for b in agents if b.cached_tokens and b.state is not AgentState.CLIENT and b is not a)
        return used - idle + len(a.pending) + self.chunk_tokens * (1 + holding) <= self.kv_budget_tokens

    @staticmethod
    def _returning(a: Agent) -> bool:
        """Its whole history waits to be prefilled again because the budget took its cells."""
        return a.evicted_at >= 0 and a.context == 0 and bool(a.pending)

    def schedule(self, agents: list[Agent], step: int) -> Plan:
        used = self.used_tokens(agents)
        self._readmit(agents, used)
        ready = [a for a in agents if a.state is AgentState.DECODE]
        filling = [a for a in agents if a.state is AgentState.PREFILL]
        # Interleave: a prefill chunk after each decode step while any agent is filling, so
        # tool results land promptly without starving the decode batch.
        if filling and (not ready or self._last_kind == "decode"):
            plan = self._prefill(agents, filling, used, bool(ready))
            if plan is not None:
                if ready and not plan.preempt and (mixed := self._mixed(agents, ready, used, step, plan)):
                    return mixed
                self._last_kind = "prefill"
                return plan
        if ready:
            self._last_kind = "decode"
            return self._decode(agents, ready, used, step)
        return Plan("idle", [])

    def _readmit(self, agents: list[Agent], used: int) -> None:
        """A preempted agent comes back (to be prefilled whole) once its history fits again (_fits_back)."""
        for a in sorted((a for a in agents if a.state is AgentState.PREEMPTED), key=lambda a: a.last_served_step):
            if self._fits_back(agents, a, used):
                a.readmitted()
                used += len(a.pending)

    def _prefill(self, agents: list[Agent], filling: list[Agent], used: int, ready: bool) -> Plan | None:
        """The next chunk of the least recently served filling agent; one whose history the budget took (its
        tool returned after its cells went) waits until it fits back, unless no agent could run otherwise."""
        order = sorted(filling, key=lambda x: (x.last_served_step, x.id))
        back = [x for x in order if not self._returning(x) or self._fits_back(agents, x, used)]
        if not back and ready:
            return None
        a = (back or order)[0]
        chunk = min(self.chunk_tokens, len(a.pending))
        preempt = self._make_room(agents, used, chunk, keep=a)
        if preempt is None:
            return None
        return Plan("prefill", [a], chunk=chunk, preempt=preempt)

    def _mixed(self, agents: list[Agent], ready: list[Agent], used: int, step: int, prefill: Plan) -> Plan | None:
        """The decode batch carrying the prefill's chunk in one call, where both fit the budget as they are
        and the mix policy says so; the next step is a prefill's turn again, so every decode step may mix."""
        plan = self._decode(agents, ready, used + prefill.chunk, step)
        if plan.preempt or not plan.agents:
            return None
        n = self._mix(plan.agents, prefill.agents[0], prefill.chunk)
        if n <= 0:
            return None
        self._last_kind = "decode"
        return Plan("decode", plan.agents, chunk=n, mixed=prefill.agents[0])

    def _decode(self, agents: list[Agent], ready: list[Agent], used: int, step: int) -> Plan:
        # least recently served first: with more ready agents than the cap, everyone takes turns
        batch = sorted(ready, key=lambda a: (a.last_served_step, a.id))[: self.batch_cap]
        preempt: list[Agent] = []
        while batch and used + len(batch) > self.kv_budget_tokens:
            victim = max((a for a in agents if a.cached_tokens and a not in preempt), key=self._victim_order)
            preempt.append(victim)
            used -= victim.context
            if victim in batch:
                batch.remove(victim)
        return Plan("decode", sorted(batch, key=lambda a: a.id), preempt=preempt)

    def _make_room(self, agents: list[Agent], used: int, need: int, keep: Agent) -> list[Agent] | None:
        preempt: list[Agent] = []
        others = sorted((a for a in agents if a is not keep and a.cached_tokens), key=self._victim_order, reverse=True)
        while used + need > self.kv_budget_tokens:
            if not others:
                return None
            victim = others.pop(0)
            preempt.append(victim)
            used -= victim.context
        return preempt

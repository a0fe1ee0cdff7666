"""The swarm's agents and the sequences they run on: which agent holds which sequence, how many sequences the
context is made with (doubled until they hold every agent, never shrunk), and agents added or removed."""

from swarmtune.engine.agents.agent import Agent, AgentState
from swarmtune.engine.agents.agent_source import AgentSource
from swarmtune.engine.agents.cells import Cells
from swarmtune.engine.backends.backend import Backend


class Roster:
    def __init__(self, backend: Backend, workload: AgentSource, agents: int, ctx_per_agent: int) -> None:
        self.backend, self.workload, self.ctx_per_agent = backend, workload, ctx_per_agent
        self.cells = Cells(backend)
        self.slots = max(agents, 1)  # the sequences the context is made with
        self.agents: list[Agent] = []  # the engine's own list: every reader shares it

    def add(self, agent_id: int) -> Agent:
        """A new agent on the first free sequence; it starts its task where the open context has that sequence
        (else when the rebuild that makes room for it has run)."""
        used = {a.seq for a in self.agents}
        a = Agent(id=agent_id, seq=next(s for s in range(self.slots) if s not in used), limit=self.ctx_per_agent)
        self.agents.append(a)
        if a.seq < self.backend.n_seqs:
            self.workload.start_task(a)
        return a

    def resize(self, n: int) -> None:
        """n agents from the next step: the last added go first (a served agent waiting for its client before
        one serving a request, which takes it with it); the streams grow where they must."""
        while len(self.agents) > n:
            a = max(self.agents, key=lambda x: (x.state is AgentState.CLIENT, x.id))
            self.cells.free(a)
            self.agents.remove(a)
        next_id = max((a.id for a in self.agents), default=-1) + 1
        self.slots = self.slots_for(n)  # where it grew, the next step rebuilds the context with room for them
        for i in range(n - len(self.agents)):
            self.add(next_id + i)

    def slots_for(self, agents: int) -> int:
        """The streams a swarm of this many agents runs on: doubled until they hold every agent (a rebuild
        each time they grow, so they grow in steps), never shrunk."""
        slots = self.slots
        while slots < agents:
            slots *= 2
        return slots

"""Where an agent's turns come from, and where its tokens go: the seam between the engine and whatever
drives its agents. The synthetic swarm (engine/workload.py) is one; agents whose turns arrive as HTTP
requests are another. The scheduler, residency, the cache check, the records and the tuner see only
`Agent`s and do not care which drives them.

The engine asks, for each agent:
- `start_task`: its first prompt (`agent.pending`, to prefill) and its chat messages;
- `turn_limit`: how many tokens this turn may generate at most;
- `on_token`: each token it generated (its text, where the tokens go);
- `end_turn`: after a turn: what comes next and when. The source sets `agent.state` to TOOL with
  `tool_ready_at` and `tool_pending` (a wait: a tool call, or a client that has not sent its next request)
  or to PREFILL with `pending` (at once), or starts a new task;
- `seed_sampler`: the agent's sampler, seeded as the source decides."""

from typing import Protocol

from swarmtune.engine.workload import Agent


class AgentSource(Protocol):
    def start_task(self, agent: Agent) -> None: ...

    def turn_limit(self, agent: Agent) -> int: ...

    def on_token(self, agent: Agent, token: int, piece: str) -> None: ...

    def end_turn(self, agent: Agent, now_s: float) -> None: ...

    def seed_sampler(self, agent: Agent) -> None: ...

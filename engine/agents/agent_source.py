"""Where an agent's turns come from, and where its tokens go: the seam between the engine and whatever
drives its agents. The synthetic swarm (engine/agents/workload.py) is one; agents whose turns arrive as HTTP
requests are another. The scheduler, residency, the cache check, the records and the tuner see only
`Agent`s and do not care which drives them.

The engine asks, for each agent:
- `start_task`: its first prompt (`agent.pending`, to prefill) and its chat messages;
- `turn_limit`: how many tokens this turn may generate at most;
- `before_step`: before each step, on the engine's thread: work that arrived since (an HTTP request)
  is given to an agent here, and only here, so no other thread touches an agent;
- `on_token`: each token it sampled (its text, where the tokens go); False ends the turn before it (a
  stop sequence, a client that left);
- `end_turn`: after a turn: what comes next and when, as the agent's own transitions (engine/agents/agent.py): a
  wait (`wait_for_tool` with the result and when it arrives, or `wait_for_client`, a client that has not
  sent its next request), `prefill_next` (at once), or a new task;
- `seed_sampler`: the agent's sampler, set as the source decides (again after a KV switch);
- `idle`: every agent waits and none has a time to wake: wait at most this long, less if work arrives;
- `on_record`: after each step, its record (what it took, its energy): a served request is charged its share;
- `traffic`: the shape of the turns it has seen, where they are not the engine's settings (served traffic),
  so that the tuner's forecasts run the swarm the engine really serves."""

from dataclasses import dataclass
from typing import Protocol

from swarmtune.engine.agents.agent import Agent
from swarmtune.engine.record.records import StepRecord


@dataclass(frozen=True)
class TrafficShape:
    """What a source's turns look like (medians over its recent turns)."""

    gen_tokens: int  # a reply's tokens
    tool_tokens: int  # what a returning turn adds to its prompt
    wait_s: float  # between a reply's end and the conversation's next turn


class AgentSource(Protocol):
    def start_task(self, agent: Agent) -> None: ...

    def turn_limit(self, agent: Agent) -> int: ...

    def before_step(self, agents: list[Agent], now_s: float) -> None: ...

    def on_token(self, agent: Agent, token: int, piece: str) -> bool: ...

    def end_turn(self, agent: Agent, now_s: float) -> None: ...

    def seed_sampler(self, agent: Agent) -> None: ...

    def idle(self, seconds: float) -> None: ...

    def on_record(self, rec: StepRecord) -> None: ...

    def traffic(self) -> TrafficShape | None: ...

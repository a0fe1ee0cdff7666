"""The swarm: coding agents whose contexts grow turn by turn, as a real agent session's does.

A turn: the agent generates up to T tokens, then receives a tool result of about M tokens (prefilled),
and so on; an agent that would outgrow its context limit starts a fresh task. Tool results are slices
of Python's own standard-library sources, so nothing is downloaded. Deterministic under the seed.
"""

import functools
import math
import random
import sysconfig
import time
from pathlib import Path

from swarmtune.engine.agents.agent import TAIL_CHARS, Agent
from swarmtune.engine.agents.agent_source import TrafficShape
from swarmtune.engine.agents.cells import Cells
from swarmtune.engine.backends.backend import Backend
from swarmtune.engine.record.records import StepRecord

SYSTEM_PROMPT = (
    "You are a coding agent working in a Python repository. Read the tool results, reason briefly, "
    "then call the next tool or propose a patch."
)
TASKS = (
    "Find why {mod} raises on an empty input and fix it with a test.",
    "Add type hints to the public functions of {mod} without changing behaviour.",
    "The CI says {mod} is slow on large inputs. Profile it and propose a faster loop.",
    "Write a regression test for the last bug fixed in {mod}.",
    "Refactor {mod} so that its parsing and its I/O live in separate functions.",
    "Explain what {mod} does to a new contributor, then list three risky spots.",
    "Port the deprecated calls in {mod} to their current replacements.",
    "Review the error handling in {mod}: which exceptions can escape to the caller?",
)


@functools.cache
def stdlib_sources() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.glob("*.py") if p.stat().st_size > 4000)


class Workload:
    def __init__(self, backend: Backend, seed: int, gen_tokens: int, tool_tokens: int,
                 tool_latency_s: float = 0.0, tool_latency_sigma: float = 1.0) -> None:
        self.backend = backend
        self.cells = Cells(backend)  # its agents' cells are edited only through it
        self.seed = seed
        self.gen_tokens = gen_tokens  # T: the most tokens an agent generates in one turn
        self.tool_tokens = tool_tokens  # M: tokens of each tool result
        self.tool_latency_s = tool_latency_s  # the median wait for a tool call; 0: none
        self.tool_latency_sigma = tool_latency_sigma
        self.sources = list(stdlib_sources())
        self._text_cache: dict[Path, str] = {}

    def reshape(self, gen_tokens: int | None, tool_tokens: int | None, tool_latency_s: float | None) -> None:
        """Its turns change shape from the next turn on (a bench's phases)."""
        if gen_tokens is not None:
            self.gen_tokens = gen_tokens
        if tool_tokens is not None:
            self.tool_tokens = tool_tokens
        if tool_latency_s is not None:
            self.tool_latency_s = tool_latency_s

    def rng(self, agent: Agent, salt: int) -> random.Random:
        return random.Random(hash((self.seed, agent.id, agent.tasks, agent.turns, salt)))

    def turn_budget(self) -> int:
        """Tokens one more turn may add: the generation, the tool result and the template's tags."""
        return self.gen_tokens + self.tool_tokens + 64

    def start_task(self, agent: Agent) -> None:
        agent.new_task()
        r = self.rng(agent, 0)
        mod = r.choice(self.sources).stem if self.sources else "json"
        agent.messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": r.choice(TASKS).format(mod=f"{mod}.py")},
        ]
        text = self.backend.text
        self.cells.restart(agent, text.tokenize(text.chat(agent.messages, add_assistant=True)))
        self.seed_sampler(agent)

    def seed_sampler(self, agent: Agent) -> None:
        """Each agent samples from its own stream, fixed by the seed, the agent and its task."""
        self.backend.steps.seed_sampler(agent.seq, hash((self.seed, agent.id, agent.tasks)) & 0x7FFFFFFF)

    def tool_result(self, agent: Agent) -> str:
        r = self.rng(agent, 1)
        if not self.sources:
            return "ok\n" * self.tool_tokens
        path = r.choice(self.sources)
        text = self._text_cache.get(path)
        if text is None:
            text = self._text_cache[path] = path.read_text(encoding="utf-8", errors="replace")
        # ~4 characters per token; cut by tokens below
        span = self.tool_tokens * 5
        start = r.randrange(0, max(1, len(text) - span))
        return f"$ sed -n ... {path.name}\n" + text[start : start + span]

    def turn_limit(self, agent: Agent) -> int:
        return self.gen_tokens

    def before_step(self, agents: list[Agent], now_s: float) -> None:
        pass  # its turns come from end_turn, on the engine's thread already

    def on_token(self, agent: Agent, token: int, piece: str) -> bool:
        """A generated token's text: the turn's answer (the next message) and the tail on screen."""
        agent.turn_text += piece
        agent.tail = (agent.tail + piece)[-TAIL_CHARS:]
        return True

    def idle(self, seconds: float) -> None:
        time.sleep(seconds)

    def on_record(self, rec: StepRecord) -> None:
        pass  # the synthetic swarm has no requests to charge

    def traffic(self) -> TrafficShape | None:
        return None  # its shape is the engine's settings

    def tool_latency(self, agent: Agent) -> float:
        """Seconds this turn's tool call takes: lognormal around the median, drawn from the seed."""
        if self.tool_latency_s <= 0:
            return 0.0
        return self.rng(agent, 2).lognormvariate(math.log(self.tool_latency_s), self.tool_latency_sigma)

    def end_turn(self, agent: Agent, now_s: float = 0.0) -> None:
        """After generating: the agent calls a tool, whose result arrives after the tool's latency (at
        once without one), or, near the limit, a fresh task begins. now_s: the engine's clock."""
        text = agent.turn_text
        agent.turn_ended()
        if agent.context + self.turn_budget() > agent.limit:
            self.start_task(agent)
            return
        agent.messages.append({"role": "assistant", "content": text})
        before = self.backend.text.chat(agent.messages, add_assistant=False)
        tool = self.tool_result(agent)
        tool_ids = self.backend.text.tokenize(tool)[: self.tool_tokens]
        tool = "".join(self.backend.text.piece(t) for t in tool_ids)
        agent.messages.append({"role": "user", "content": "Tool result:\n" + tool})
        after = self.backend.text.chat(agent.messages, add_assistant=True)
        delta = after[len(before) :] if after.startswith(before) else after
        wait_s = self.tool_latency(agent)
        if wait_s > 0:
            agent.wait_for_tool(self.backend.text.tokenize(delta), now_s + wait_s)
        else:
            agent.prefill_next(self.backend.text.tokenize(delta))

"""What a stretch of steps did, measured or forecast, in the terms of every objective."""

from dataclasses import dataclass, replace

from swarmtune.engine.record.records import StepRecord
from swarmtune.engine.tune.goal import Goal


@dataclass
class Tally:
    """What a stretch of steps did: the inputs of every objective."""

    tokens: int = 0
    seconds: float = 0.0
    joules: float = 0.0
    joules_known: bool = True
    watt_seconds: float = 0.0
    per_agent: dict[int, int] | None = None
    # tokens prefilled again because a history lost its cells (preempted, dropped at a tool, refused its way
    # back from host memory): the churn a KV budget causes
    reprefilled: int = 0

    def add(self, r: StepRecord) -> None:
        if r.kind == "tune":
            return
        self.reprefilled += r.lost_tokens
        span = r.seconds + r.residency_seconds
        self.seconds += span
        if r.kind == "decode":
            self.tokens += r.tokens
            if self.per_agent is None:
                self.per_agent = {}
            for i in r.batch_ids:
                self.per_agent[i] = self.per_agent.get(i, 0) + 1
        if r.kind != "rebuild":
            if r.joules is None:
                self.joules_known = False
            else:
                self.joules += r.joules
                self.watt_seconds += (r.watts or 0.0) * r.seconds

    def score(self, goal: Goal, n_agents: int) -> float:
        """Higher is better. A setting over the power cap, or under the floor, loses to any that is not."""
        if self.seconds <= 0:
            return 0.0
        rate = self.tokens / self.seconds
        if goal.power_cap_watts is not None and self.joules_known and self.seconds > 0:
            watts = self.watt_seconds / self.seconds
            if watts > goal.power_cap_watts:
                return -watts  # infeasible: the least over the cap wins among the infeasible
        if goal.objective == "joules_per_token":
            if not self.joules_known or self.joules <= 0:
                return 0.0
            return self.tokens / self.joules  # tokens per joule: fewer joules per token is higher
        if goal.objective == "floor":
            per = self.per_agent or {}
            slowest = min((per.get(i, 0) for i in range(n_agents)), default=0) / self.seconds
            if slowest < goal.floor_tokens_per_s:
                return slowest - goal.floor_tokens_per_s  # negative: below the floor
        return rate

    def objective_value(self, goal: Goal) -> float | None:
        """The objective in its own unit, for the record: tok/s, or J/token."""
        if self.seconds <= 0:
            return None
        if goal.objective == "joules_per_token":
            return self.joules / self.tokens if self.tokens and self.joules_known else None
        return self.tokens / self.seconds


def _copy(t: Tally) -> Tally:
    return replace(t, per_agent=None if t.per_agent is None else dict(t.per_agent))


class SpanTally:
    """A stretch's tally at each span from its start (one epoch, two, ... the horizon): what a forecast
    said and what came are compared over the same span. A span is closed by the first record past it."""

    def __init__(self, start_s: float, spans: list[float]) -> None:
        self.start_s = start_s
        self.spans = spans
        self.tally = Tally()
        self.closed: list[Tally] = []
        self.checked = 0  # closed spans already compared with their forecast

    def add(self, r: StepRecord) -> None:
        while len(self.closed) < len(self.spans) and r.t > self.start_s + self.spans[len(self.closed)]:
            self.closed.append(_copy(self.tally))
        self.tally.add(r)

    def finish(self) -> list[Tally]:
        """A forecast's end: the spans not yet closed hold all it ran."""
        return self.closed + [_copy(self.tally) for _ in self.spans[len(self.closed):]]



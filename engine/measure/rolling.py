"""Decode tokens per second (and steps per second) over the last few seconds of a run's clock: the live
rate the dashboard and `/metrics` show, computed in one place."""

from collections import deque
from dataclasses import dataclass, field

from swarmtune.engine.record.records import StepRecord

WINDOW_S = 5.0


@dataclass
class RollingRate:
    window_s: float = WINDOW_S
    samples: deque[tuple[float, int]] = field(default_factory=deque)  # (t, tokens decoded at that step)
    tokens_total: int = 0
    steps_total: int = 0
    # speculation since start: drafts proposed (an agent's, a step), drafted tokens verified, and kept
    drafts_total: int = 0
    drafted_total: int = 0
    accepted_total: int = 0

    def add(self, r: StepRecord) -> None:
        tokens = r.tokens if r.kind == "decode" else 0
        self.steps_total += 1
        self.tokens_total += tokens
        self.drafts_total += r.drafts
        self.drafted_total += r.drafted
        self.accepted_total += r.accepted
        self.samples.append((r.t, tokens))
        while self.samples and r.t - self.samples[0][0] > self.window_s:
            self.samples.popleft()

    def _span(self) -> float:
        return self.samples[-1][0] - self.samples[0][0] if len(self.samples) >= 2 else 0.0

    @property
    def tokens_per_second(self) -> float:
        """The tokens of every step after the window's first, over the time since it."""
        span = self._span()
        return sum(t for _, t in list(self.samples)[1:]) / span if span > 0 else 0.0

    @property
    def steps_per_second(self) -> float:
        span = self._span()
        return (len(self.samples) - 1) / span if span > 0 else 0.0

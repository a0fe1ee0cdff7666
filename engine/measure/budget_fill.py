"""When the KV budget fills: how fast the resident histories grow (the tokens whose cells the budget pays
for, over a recent window of the run's clock), carried forward to the budget at a setting. The place is
exact (the byte model's budget in tokens); the time is a forecast from measured growth. What the dashboard's
budget marker (tui/budget.py) and the tuner's budget outlook (engine/tune/budget_outlook.py) both say."""

from collections import deque
from dataclasses import dataclass

from swarmtune.engine.record.records import StepRecord

GROWTH_WINDOW_S = 60.0  # the growth is read over this much of the run (its clock)


@dataclass(frozen=True)
class BudgetForecast:
    kv: str  # the setting in force
    budget_tokens: int  # what the KV budget holds at it, summed over agents
    resident_tokens: int  # what the resident histories hold now
    full_at_context: float  # the context per resident agent at which they fill it, growing alike
    growth_tokens_per_s: float | None  # the resident histories' growth, measured; None: not yet, or not growing

    @property
    def seconds_left(self) -> float | None:
        """Until the budget fills at the measured growth (0: it is full; None: no growth measured)."""
        left = self.budget_tokens - self.resident_tokens
        if left <= 0:
            return 0.0
        g = self.growth_tokens_per_s
        return left / g if g is not None and g > 0 else None

    def text(self) -> str:
        when = self.seconds_left
        if when == 0:
            return f"KV budget at {self.kv} full"
        if when is None:
            eta = ""
        else:
            eta = f", in ~{when / 60:.1f} min" if when >= 90 else f", in ~{when:.0f} s"
            eta += " (forecast)"  # the place is the byte model's; the time, measured growth carried on
        return f"{self.kv} budget full at {self.full_at_context:,.0f}/agent{eta}"


def resident_tokens(r: StepRecord) -> int:
    """The tokens the resident histories hold (the cells the KV budget pays for)."""
    return sum(a.context for a in r.agents if a.residency == "cache" and a.state != "preempted")


class ResidentGrowth:
    def __init__(self, window_s: float = GROWTH_WINDOW_S) -> None:
        self.window_s = window_s
        self.used: deque[tuple[float, int]] = deque(maxlen=512)  # (t, resident tokens) over recent steps

    def add(self, r: StepRecord) -> None:
        if r.kind in ("decode", "prefill", "idle"):
            self.used.append((r.t, resident_tokens(r)))
        while self.used and r.t - self.used[0][0] > self.window_s:
            self.used.popleft()

    @property
    def resident(self) -> int | None:
        return self.used[-1][1] if self.used else None

    def tokens_per_s(self) -> float | None:
        """The resident histories' growth over the window, measured; None: too few steps to say."""
        if len(self.used) < 2:
            return None
        (t0, u0), (t1, u1) = self.used[0], self.used[-1]
        return (u1 - u0) / (t1 - t0) if t1 > t0 else None

"""When the KV budget will stop holding the swarm at the setting in force, foreseen from what is known exactly:
the budget and the bytes per token at that setting (the header's byte model), and the resident histories'
growth as measured over the recent steps. Shown where the user decides: the speedup plot marks the context an
agent reaches when the budget fills, and its legend says when that comes at the measured growth (the time is
a forecast from measured growth; the place is exact)."""

from collections import deque
from dataclasses import dataclass, field

from swarmtune.engine.model.bytes_model import bytes_model_from_header
from swarmtune.engine.records import StepRecord

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


@dataclass
class BudgetWatch:
    used: deque = field(default_factory=lambda: deque(maxlen=512))  # (t, resident tokens) over recent steps

    def add(self, r: StepRecord) -> None:
        if r.kind in ("decode", "prefill", "idle"):
            self.used.append((r.t, resident(r)))
        while self.used and r.t - self.used[0][0] > GROWTH_WINDOW_S:
            self.used.popleft()

    def growth_tokens_per_s(self) -> float | None:
        if len(self.used) < 2:
            return None
        (t0, u0), (t1, u1) = self.used[0], self.used[-1]
        return (u1 - u0) / (t1 - t0) if t1 > t0 else None

    def forecast(self, header: dict, r: StepRecord | None) -> BudgetForecast | None:
        """None where no KV budget is set (each agent's own context limit binds, the agents panel shows it) or
        the header cannot say the bytes per token."""
        s = header.get("settings") or {}
        budget_bytes = s.get("kv_budget_bytes")
        bm = bytes_model_from_header(header)
        if r is None or not budget_bytes or bm is None or not r.agents:
            return None
        kv = r.kv
        slots = int(s.get("slots") or len(r.agents))
        budget = bm.budget_tokens(float(budget_bytes), kv, slots, int(s.get("ctx_per_agent") or 0),
                                  swa_slack_tokens=int(s.get("chunk_tokens") or 0))
        holding = [a for a in r.agents if a.residency == "cache" and a.state != "preempted"] or r.agents
        now = resident(r)
        return BudgetForecast(r.kv_type, budget, now, budget / len(holding), self.growth_tokens_per_s())


def resident(r: StepRecord) -> int:
    """The tokens the resident histories hold (the cells the KV budget pays for)."""
    return sum(a.context for a in r.agents if a.residency == "cache" and a.state != "preempted")

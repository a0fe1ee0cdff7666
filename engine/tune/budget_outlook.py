"""The KV budget's outlook, as a look weighs it: when the budget binds at the setting in force, and each way
out against the churn staying will cause.

When is known before the churn starts: the budget in tokens at each setting and the bytes per token are the
byte model's (exact), and the resident histories grow at a rate the tuner measures (engine/measure/
budget_fill.py). What staying costs, and what each way out buys, come from the look's own forecasts (the swarm
run forward under each neighbour, modeled), which already run past the point where the budget binds: their
tokens per second, and the tokens they prefill again because a history lost its cells. A way out is a KV type
with fewer bytes per token (within the quality budget, as the live check measured it at these contexts), K
and V apart where the allowed types hold such a pair, swap or drop for agents at a tool, or a lower cap. So an
experiment can start before the budget binds, on the same evidence rules as any other: this module only says
what the look weighed, in one line a person can act on."""

import math
from dataclasses import dataclass

from swarmtune.engine.agents.agent import Residency
from swarmtune.engine.engine_view import EngineView
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.measure.budget_fill import BudgetForecast, ResidentGrowth
from swarmtune.engine.tune.events import Foreseen
from swarmtune.engine.tune.forecast import Runs, gain
from swarmtune.engine.tune.goal import Goal, Setting


@dataclass(frozen=True)
class WayOut:
    to: Setting
    gain: float | None  # the objective's forecast gain over staying (modeled)
    reprefilled: int  # tokens its forecast prefilled again over the horizon (modeled)
    mean_kl: float | None  # its KV type's mean KL at these contexts (measured); None: not measured, or the same type

    def text(self, cur: Setting, objective: str) -> str:
        g = "n/a" if self.gain is None else f"{self.gain:+.0%} {'tok/s' if objective == 'tokens_per_s' else objective}"
        q = "" if self.to.kv == cur.kv else (
            ", KL not measured here" if self.mean_kl is None else f", KL {self.mean_kl:.4f} (measured)")
        return f"{lever(cur, self.to)} {g}{q}, {self.reprefilled:,} re-prefilled"


@dataclass(frozen=True)
class BudgetOutlook:
    fill: BudgetForecast
    horizon_s: float
    staying_reprefilled: int  # what the forecast of staying prefilled again over the horizon (modeled)
    ways: tuple[WayOut, ...]  # best first
    ruled_out: str | None  # the quality budget's exclusions, in words

    def binds(self) -> bool:
        """The budget binds within the horizon at the setting in force (forecast), or already does."""
        left = self.fill.seconds_left
        return self.staying_reprefilled > 0 or (left is not None and left <= self.horizon_s)

    def head(self) -> str:
        return (f"KV budget: {self.fill.text()}; staying re-prefills {self.staying_reprefilled:,} tokens over "
                f"{self.horizon_s:.0f} s (modeled)")

    def text(self, cur: Setting, objective: str, weighing: Setting | None) -> str:
        ways = "; ".join(w.text(cur, objective) for w in self.ways) or "none"
        line = f"tune: {self.head()}; ways out: {ways}"
        if self.ruled_out:
            line += f"; {self.ruled_out}"
        return line + (f"; weighing {lever(cur, weighing)}" if weighing is not None else "; weighing none: "
                       "no way out worth an experiment")

    def event(self, cur: Setting, objective: str, weighing: Setting | None) -> Foreseen:
        f = self.fill
        left = f.seconds_left
        return Foreseen(
            kv=cur.kv, budget_tokens=f.budget_tokens, resident_tokens=f.resident_tokens,
            full_at_context=round(f.full_at_context, 1),
            growth_tokens_per_s=None if f.growth_tokens_per_s is None else round(f.growth_tokens_per_s, 2),
            binds_in_s=None if left is None else round(left, 1), horizon_s=round(self.horizon_s, 1),
            staying_reprefilled=self.staying_reprefilled,
            ways=[{"to": w.to.as_dict(), "gain": None if w.gain is None else round(w.gain, 4),
                   "reprefilled": w.reprefilled, "mean_kl": w.mean_kl} for w in self.ways],
            why=self.text(cur, objective, weighing), weighing=weighing, ruled_out=self.ruled_out)


def lever(a: Setting, b: Setting) -> str:
    """What moves from a to b, in a person's words."""
    parts = []
    if a.kv != b.kv:
        parts.append(f"KV {b.kv}")
    if a.residency != b.residency:
        parts.append(f"{b.residency} at tools")
    if a.batch_cap != b.batch_cap:
        parts.append(f"cap {b.batch_cap}")
    return ", ".join(parts) or "staying"


def is_way_out(engine: EngineView, cur: Setting, c: Setting) -> bool:
    """A move that holds more history in the same budget, or asks less of it: fewer bytes per token, a
    history out of the cache while its agent waits, fewer agents decoding at once."""
    bm = engine.facts.bytes_model
    return ((c.kv != cur.kv and bm.kv_bytes_per_token(c.kv) < bm.kv_bytes_per_token(cur.kv))
            or (c.residency != cur.residency and c.residency != "keep") or c.batch_cap < cur.batch_cap)


def outlook(engine: EngineView, cur: Setting, base: Runs, forecasts: dict[Setting, Runs], growth: ResidentGrowth,
            goal: Goal, horizon_s: float, kl: dict[KVSetting, float | None],
            ruled_out: str | None) -> BudgetOutlook | None:
    """The outlook at this look; None where no KV budget is set (each agent's own limit binds) or nothing is
    resident yet. kl: the candidate KV types' mean KL at these contexts (measured; None: not)."""
    if engine.s.kv_budget_bytes is None or growth.resident is None or not engine.agents:
        return None
    n = len(engine.agents)
    budget = engine.budget_tokens(cur.kv)
    # the agents whose histories the cache holds (a swapped or dropped one's are out of it), growing alike
    holding = [a for a in engine.agents if a.residency is Residency.CACHE] or engine.agents
    fill = BudgetForecast(cur.kv.label, budget, growth.resident, budget / len(holding), growth.tokens_per_s())

    def score(runs: Runs) -> float:
        return sum(run[-1].score(goal, n) for run in runs) / len(runs)

    def reprefilled(runs: Runs) -> int:
        return round(sum(run[-1].reprefilled for run in runs) / len(runs))

    base_score = score(base)
    ways = [WayOut(c, gain(score(f), base_score), reprefilled(f), kl.get(c.kv) if c.kv != cur.kv else None)
            for c, f in forecasts.items() if is_way_out(engine, cur, c)]
    ways.sort(key=lambda w: -math.inf if w.gain is None else -w.gain)
    return BudgetOutlook(fill, horizon_s, reprefilled(base), tuple(ways), ruled_out)


def quality_ruled_out(engine: EngineView, cur: Setting, goal: Goal, excluded: dict[KVSetting, float | None],
                      allowed: list[KVSetting]) -> str | None:
    """One line where the quality budget rules out every KV type smaller than the one in force that the goal
    allows (the tuner then weighs residency and cap moves alone); None where it leaves one in play."""
    bm = engine.facts.bytes_model
    smaller = [k for k in allowed if bm.kv_bytes_per_token(k) < bm.kv_bytes_per_token(cur.kv)]
    if goal.kv_quality is None or not smaller or any(k not in excluded for k in smaller):
        return None
    longest = max((len(a.history) for a in engine.agents), default=0)
    each = ", ".join(f"{k}: " + ("not measured at these contexts" if excluded[k] is None
                                 else f"mean KL {excluded[k]:.4f} measured") for k in smaller)
    return (f"the quality budget {goal.kv_quality:g} nats rules out every smaller KV type at {longest:,} tokens "
            f"({each}): a residency or cap move instead")


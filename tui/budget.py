"""When the KV budget will stop holding the swarm at the setting in force, foreseen from what is known exactly:
the budget and the bytes per token at that setting (the header's byte model), and the resident histories'
growth as measured over the recent steps. Shown where the user decides: the speedup plot marks the context an
agent reaches when the budget fills, and its legend says when that comes at the measured growth (the time is
a forecast from measured growth; the place is exact)."""

from swarmtune.engine.measure.budget_fill import BudgetForecast, ResidentGrowth, resident_tokens
from swarmtune.engine.model.bytes_model import bytes_model_from_header
from swarmtune.engine.record.records import StepRecord


class BudgetWatch(ResidentGrowth):
    """The resident histories' growth (engine/measure/budget_fill.py), and the forecast it makes."""

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
        now = resident_tokens(r)
        return BudgetForecast(r.kv_type, budget, now, budget / len(holding), self.tokens_per_s())



def outlook_text(d: dict) -> str:
    """The tuner's budget line (a `budget` tune record) short enough for the status line: when the budget binds
    at the setting in force, what staying re-prefills, and the way out weighed with its forecast gain."""
    left = d.get("binds_in_s")
    when = "binds" if left is None else "full" if left == 0 else f"binds in ~{left:.0f} s"
    text = f"KV budget {when}: staying re-prefills {d.get('staying_reprefilled', 0):,} (forecast)"
    weighing = d.get("weighing")
    way = next((w for w in d.get("ways", []) if w.get("to") == weighing), None) if weighing else None
    if way is not None and way.get("gain") is not None:
        text += f", the way out tried {way['gain']:+.0%} tok/s, {way['reprefilled']:,} re-prefilled"
    elif weighing is None:
        text += ", no way out worth an experiment"
    if d.get("ruled_out"):
        text += "; --kv-quality rules out the smaller KV types"
    return text

"""The quality budget's guard: under `--kv-quality`, a live KV setting the quality check measured past the
budget (its KL grows with the contexts) is left at once for the reference (f16), with the figure that said so."""

from dataclasses import replace

from swarmtune.engine.engine_view import EngineView
from swarmtune.engine.quality.kv_quality import REFERENCE
from swarmtune.engine.record.records import mean_context
from swarmtune.engine.tune.events import Decision, TuneEvent
from swarmtune.engine.tune.goal import Goal, Setting
from swarmtune.engine.tune.propose import Proposer, quality_ledger
from swarmtune.engine.tune.trials import Trials, setting_of


def quality_guard(goal: Goal, engine: EngineView, trials: Trials, proposer: Proposer) -> list[TuneEvent]:
    """Under a quality budget, the live KV setting measured past it is left at once for the reference, and
    said why; an experiment under way is abandoned (its candidate or its incumbent crossed the budget:
    nothing it measures counts)."""
    if trials.switching:
        return []
    live = setting_of(engine)
    decision = past_budget(goal, engine, live)
    if decision is None:
        return []
    trials.exp = None
    if not trials.move(engine, live, decision.to):
        return []
    proposer.remember_tried(engine, live)
    return [decision]


def past_budget(goal: Goal, engine: EngineView, live: Setting) -> Decision | None:
    """The move back to the reference where the live setting was measured past the budget, else None."""
    budget = goal.kv_quality
    ledger = quality_ledger(engine)
    if budget is None or ledger is None:
        return None
    longest = max((len(a.history) for a in engine.agents), default=0)
    kl = ledger.mean_kl(live.kv, longest)
    if kl is None or kl <= budget or live.kv == REFERENCE:
        return None
    f = ledger.figure(live.kv, longest)
    band = f"{f.band[0]}-{f.band[1]}" if f is not None else "these"
    return Decision(
        from_=live, to=replace(live, kv=REFERENCE), objective="kv_quality", predicted_gain=0.0,
        predicted_gain_source="n/a", trial=False, forecast_spread=None, horizon_s=0.0,
        mean_context=round(mean_context([a.context for a in engine.agents]), 1), forecast_error=0.0,
        forecast_error_source="n/a: a quality budget, measured", kv_step_time_source=None,
        why=f"tune: KV {live.kv} measured mean KL {kl:.4f} nats at contexts {band}, past the quality budget "
            f"{budget:g}: back to {REFERENCE} (measured)")

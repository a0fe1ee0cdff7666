"""What an experiment's end says: its measured outcome and the forecast's verdict (Experimented), the move
where it was kept (Decision), and what the tuner has spent so far (Spent), each with its line of why."""

import math

from swarmtune.engine.tune.cost import Spending
from swarmtune.engine.tune.events import Decision, Experimented, Spent, TuneEvent
from swarmtune.engine.tune.experiment import CONFIDENCE, MIN_PAIRS, Experiment
from swarmtune.engine.tune.goal import Goal, Setting
from swarmtune.engine.tune.propose import what
from swarmtune.engine.tune.verdict import restated


def ended(x: Experiment, result: str, live: Setting, verdict: str | None, lost: float, goal: Goal, source: str,
          mean_ctx: float, horizon_s: float, cost: Spending, now_s: float) -> list[TuneEvent]:
    """x ended with result (kept | rejected | gave up | ended | abandoned) while live was in force; verdict:
    the forecast's; lost: the tokens its candidate's blocks cost; source: the backend's."""
    r = x.result()
    # on fewer than MIN_PAIRS pairs (rejected early), the factors with the incumbent's noise for a spread
    dec = x.step_factor("decode") or x.early_step_factor("decode")
    pre = x.step_factor("prefill") or x.early_step_factor("prefill")
    if r.pairs < MIN_PAIRS and (early := x.early_result()) is not None:
        r = early
    unf, mid, fav = x.corrected or (None, None, None)
    g = "n/a" if r.gain is None else f"{r.gain:+.1%}"
    bounds = "" if r.low is None else f" (95%: {r.low:+.1%} to {r.high:+.1%})"
    steps = "" if dec is None else (f"; its decode steps {dec[0]:.2f}x the model's relative to the incumbent's "
                                   f"({dec[1]:.2f}-{dec[2]:.2f})"
                                   + ("" if pre is None else f", prefill {pre[0]:.2f}x"))
    again = "" if mid is None else f"; forecast again on them {math.expm1(mid):+.1%}" + (
        "" if unf is None else f" (at worst {math.expm1(unf):+.1%})")
    if mid is not None and x.forecast_gain is not None and restated(x, mid) > math.log1p(x.forecast_error):
        again += (f", {abs(math.expm1(mid) - x.forecast_gain) * 100:.1f} points from the proposal's on steps as "
                  "modeled: that move counted as its error")
    words = {"kept": f"kept: past its bar {x.bar:+.1%}",
             "rejected": f"not kept: short of its bar {x.bar:+.1%}",
             "gave up": f"not kept: no verdict after {r.pairs} pairs (its budget, or its central estimate "
                        "short of what keeping needs)",
             "ended": "the run ended before a verdict",
             "abandoned": f"abandoned: the setting moved to {live.label()}"}
    why = (f"tune experiment: {what(x.incumbent, x.candidate)} over {r.pairs} interleaved pairs: objective "
           f"{g}{bounds} (measured){steps}{again} (modeled); forecast "
           + ("n/a" if x.forecast_gain is None else f"{x.forecast_gain:+.1%}")
           + f" ({verdict or 'no verdict'}); {words[result]}; its switches {x.switch_s:.2f} s, "
             f"{x.switch_cells:,} cells, {lost:+.0f} tokens lost to it")
    out: list[TuneEvent] = [Experimented(
        from_=x.incumbent, to=x.candidate, objective=goal.objective, result=result, pairs=r.pairs,
        objective_gain=_round(r.gain), objective_low=_round(r.low), objective_high=_round(r.high),
        decode_factor=None if dec is None else round(dec[0], 4),
        decode_factor_low=None if dec is None else round(dec[1], 4),
        decode_factor_high=None if dec is None else round(dec[2], 4),
        prefill_factor=None if pre is None else round(pre[0], 4),
        corrected_gain=None if mid is None else round(math.expm1(mid), 4),
        corrected_low=None if unf is None else round(math.expm1(unf), 4),
        corrected_high=None if fav is None else round(math.expm1(fav), 4),
        confidence=CONFIDENCE, forecast_gain=_round(x.forecast_gain), verdict=verdict,
        seconds_incumbent=round(x.seconds_on("A"), 2), seconds_candidate=round(x.seconds_on("B"), 2),
        switches=x.switches_made(), switch_s=round(x.switch_s, 3), switch_cells=x.switch_cells,
        tokens_lost=round(lost, 1),
        source=f"{source}: paired blocks, Student's t on the pairs' spread (measured); the "
               "corrected gain forecast on the measured step times (modeled)",
        why=why)]
    if result == "kept":
        out.append(Decision(
            from_=x.incumbent, to=x.candidate, objective=goal.objective,
            predicted_gain=round(math.expm1(mid), 4) if mid is not None else _round(r.gain) or 0.0,
            predicted_gain_source="modeled on step times measured in an experiment" if mid is not None
            else "measured: the objective in interleaved pairs", trial=x.exploratory,
            forecast_spread=None, horizon_s=round(horizon_s, 1), mean_context=round(mean_ctx, 1),
            forecast_error=round(x.forecast_error, 4), forecast_error_source="the proposal's (modeled)",
            kv_step_time_source=None,
            why=f"tune: {what(x.incumbent, x.candidate)}: kept on what the swarm measured ({words[result]})"))
    out.append(spent(cost, now_s))
    return out


def spent(s: Spending, now_s: float) -> Spent:
    return Spent(think_s=round(s.think_s, 3), think_cpu_s=round(s.think_cpu_s, 3), forecasts=s.forecasts,
                 looks=s.looks, looks_skipped=s.looks_skipped, probe_s=round(s.probe_s, 3),
                 switches=s.switches, switch_s=round(s.switch_s, 3), switch_cells=s.switch_cells,
                 experiments=s.experiments, experiment_s=round(s.experiment_s, 2),
                 tokens_lost=round(s.tokens_lost, 1), why=s.line(now_s), looks_waived=s.looks_waived)


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)

"""What the tuner holds a swarm to (its objective and constraints) and what it moves (a setting)."""

import math
from dataclasses import dataclass

from swarmtune.engine.errors import UserError
from swarmtune.engine.kv_types import kv_type
from swarmtune.engine.tune_events import Setting

__all__ = ["OBJECTIVES", "Goal", "Setting", "parse_allowed_kv", "parse_objective"]

OBJECTIVES = ("tokens_per_s", "joules_per_token", "floor")


@dataclass(frozen=True)
class Goal:
    objective: str = "tokens_per_s"  # tokens_per_s | joules_per_token | floor
    floor_tokens_per_s: float = 0.0  # floor: no agent below this rate
    allowed_kv: tuple[str, ...] = ()  # KV types the tuner may use; () = only the run's own (quality is the user's call)
    power_cap_watts: float | None = None
    epoch_s: float = 10.0  # how often it looks
    # how far each forecast runs when the run's length is unknown (the dashboard, serve): long enough to see
    # the KV budget fill as contexts grow (on the simulated RX 9070 XT, q8_0's gain over f16 from an empty
    # swarm is +7% over 120 s and +32% over 240 s), short enough that a forecast costs a few hundred ms here.
    # A run of known length (run_s: --duration, the bench) plans only for what is left of it.
    horizon_s: float = 240.0
    run_s: float | None = None  # the run's length on the engine's clock, where known
    dwell_s: float = 30.0  # the least time between two changes
    margin: float = 0.05  # a change must be forecast to gain at least this much (hysteresis)
    revisit_context_change: float = 0.25  # a setting left before returns only once contexts moved this much
    forecast_seeds: int = 2  # tool-latency draws per forecast, the same for every candidate (averaged)
    # the best of several noisy forecasts is the luckiest as often as the best (the winner's curse): the
    # gain it acts on, and states, comes from this many fresh draws of it and of staying
    confirm_seeds: int = 4
    # on a real backend the forecasts run on the engine's own cores: at most this share of the wall clock (the
    # first look, planned with the probe before the swarm's first step, aside)
    think_share: float = 0.03
    # the rms forecast error assumed before three forecasts of staying were checked on this run: a move needs
    # its gain past the margin plus this (or the measured one, once there is one); a wrong move is then
    # caught by the closed loop within a few dozen steps (engine/tune/watch.py)
    prior_error: float = 0.05


def parse_objective(text: str) -> tuple[str, float]:
    """tokens_per_s | joules_per_token | floor:X (tokens/s with no agent below X tok/s)."""
    name, _, arg = text.partition(":")
    if name not in OBJECTIVES:
        raise UserError(f"unknown objective {text!r}: use tokens_per_s, joules_per_token or floor:X", field="autotune")
    if name == "floor":
        try:
            floor = float(arg)
        except ValueError:
            floor = math.nan
        if not math.isfinite(floor) or floor <= 0:
            raise UserError(f"objective floor needs a rate in tok/s, e.g. floor:2 (got {text!r})", field="autotune")
        return name, floor
    if arg:
        raise UserError(f"objective {name} takes no value (got {text!r})", field="autotune")
    return name, 0.0


def parse_allowed_kv(text: str) -> tuple[str, ...]:
    return tuple(kv_type(k.strip()).name for k in text.split(",") if k.strip())



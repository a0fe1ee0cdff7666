"""What the tuner holds a swarm to (its objective and constraints) and what it moves (a setting)."""

import math
from dataclasses import dataclass

from swarmtune.engine.errors import UserError
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.tune.events import Setting

__all__ = ["OBJECTIVES", "Goal", "Setting", "parse_objective"]

OBJECTIVES = ("tokens_per_s", "joules_per_token", "floor")
PROBE_MIN_RUN_S = 600.0  # a run this long or longer (or of unknown length) times its KV types in a side cache


@dataclass(frozen=True)
class Goal:
    objective: str = "tokens_per_s"  # tokens_per_s | joules_per_token | floor
    floor_tokens_per_s: float = 0.0  # floor: no agent below this rate
    # KV settings the tuner may use; () = only the run's own (quality is the user's call)
    allowed_kv: tuple[KVSetting, ...] = ()
    power_cap_watts: float | None = None
    epoch_s: float = 10.0  # how often it looks
    # how far each forecast runs when the run's length is unknown (the dashboard, serve): long enough to see
    # the KV budget fill as contexts grow (on the simulated RX 9070 XT, q8_0's gain over f16 from an empty
    # swarm is +7% over 120 s and +32% over 240 s), short enough that a forecast costs a few hundred ms here.
    # A run of known length (run_s: --duration, the bench) plans only for what is left of it.
    horizon_s: float = 240.0
    run_s: float | None = None  # the run's length on the engine's clock, where known
    dwell_s: float = 30.0  # how long a held setting's tail is read by `swarmtune tune`'s final print
    margin: float = 0.05  # a forecast gain past this and its error proposes an experiment (not an exploration)
    forecast_seeds: int = 2  # tool-latency draws per forecast, the same for every candidate (averaged)
    # its thinking runs on the engine's thread: at most this share of the run's clock (engine/tune/cost.py).
    # A third of the 3% a tuner may lose against its start: the rest is left for the noise of the runs
    think_share: float = 0.01
    # the sim's clock does not wait for a forecast: what one is charged there (modeled; 0, unless a test
    # makes thinking dear to see the tuner do less of it)
    sim_think_s: float = 0.0
    # experiments (engine/tune/experiment.py): a block's least length on the engine's clock (longer where a
    # switch costs more), the most pairs before it gives up, and the share of the run experiments the
    # forecast cannot back (within its error) may take
    block_s: float = 1.0
    max_pairs: int = 8
    explore_share: float = 0.1
    # the rms forecast error assumed before three forecasts of staying were checked on this run: a forecast
    # gain past the margin plus this (or the measured one, once there is one) proposes an experiment
    prior_error: float = 0.05
    # the most mean KL (nats per token, against f16/f16) a KV setting may cost at the swarm's contexts, as the
    # live check measured it (engine/quality/quality_check.py); None: off (speed alone decides, as before)
    kv_quality: float | None = None

    def probes_pay(self) -> bool:
        """A side-cache probe costs 3-8 s of the swarm's time on these 2-core CPUs (two prefilled histories
        per type): worth it in a run of unknown length (the dashboard, serve) or a long one, not in a short
        one, where an experiment on the swarm itself measures the type where it matters."""
        return self.run_s is None or self.run_s >= PROBE_MIN_RUN_S


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

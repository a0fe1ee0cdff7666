"""What the engine asks of power: watts and joules for one step, and where they came from."""

from dataclasses import dataclass

from swarmtune.engine.errors import UserError
from swarmtune.engine.measure.power.sampler import PowerSampler
from swarmtune.engine.measure.power.sensors import SENSORS, SensorError, open_sensor
from swarmtune.engine.model.profiles import Profile


@dataclass(frozen=True)
class StepPower:
    watts: float
    joules: float
    source: str  # measured:<sensor> | modeled


class SampledMeter:
    def __init__(self, sampler: PowerSampler) -> None:
        self.sampler = sampler
        self.label = sampler.label
        self.reason = ""

    def step(self, t0: float, t1: float, batch: int, seconds: float) -> StepPower | None:
        j = self.sampler.energy_between(t0, t1)
        if j is None or t1 <= t0:
            return None  # the first samples have no delta yet
        return StepPower(j / (t1 - t0), j, self.label)

    watts_at = None  # a sensor measures watts; it has no model of them

    def close(self) -> None:
        self.sampler.stop()


class ModeledMeter:
    """A fixed floor plus a term per active agent; always labelled modeled."""

    label = "modeled"

    def __init__(self, floor_watts: float, per_agent_watts: float) -> None:
        self.floor_watts = floor_watts
        self.per_agent_watts = per_agent_watts
        self.reason = f"modeled: {floor_watts:g} W + {per_agent_watts:g} W per active agent"

    def watts_at(self, batch: int) -> float:
        return self.floor_watts + self.per_agent_watts * batch

    def step(self, t0: float, t1: float, batch: int, seconds: float) -> StepPower:
        w = self.watts_at(max(batch, 1))
        return StepPower(w, w * seconds, self.label)

    def close(self) -> None:
        pass


class NoMeter:
    label = None

    def __init__(self, reason: str, tried: list[str] | None = None) -> None:
        self.reason = reason  # one line, for a person: what the dashboard's power panel says
        self.tried = tried or []  # each sensor tried and why it did not answer (`swarmtune power`, the header)

    def step(self, t0: float, t1: float, batch: int, seconds: float) -> None:
        return None

    watts_at = None

    def close(self) -> None:
        pass


CHOICES = ("auto", "none", "modeled", *SENSORS)


def make_meter(choice: str, profile: Profile | None = None, root: str | None = None,
               interval_s: float = 0.1) -> "Meter":
    """auto: the profile's model on the sim backend; else the first sensor that works, or n/a with why."""
    if choice not in CHOICES:
        raise UserError(f"unknown power source {choice!r}; choose one of {', '.join(CHOICES)}")
    if choice == "none":
        return NoMeter("power off (--power none)")
    if choice == "modeled" or (choice == "auto" and profile is not None):
        if profile is None:
            raise UserError("modeled power needs a hardware profile: use --sim PROFILE")
        return ModeledMeter(profile.power_floor_watts, profile.power_per_agent_watts)
    if profile is not None:
        raise UserError(f"a simulated run has no {choice} sensor to read; use --power modeled")
    names = SENSORS if choice == "auto" else (choice,)
    reasons = []
    for name in names:
        try:
            sensor = open_sensor(name, root)
        except SensorError as e:
            reasons.append(f"{name}: {e}")
            continue
        sampler = PowerSampler(sensor, interval_s=interval_s)
        sampler.start()
        return SampledMeter(sampler)
    if choice != "auto":
        raise UserError(f"power source {choice} is not available: {reasons[0].split(': ', 1)[1]}")
    # the panel says it in a line; each sensor's own failure (an exception's text) is for `swarmtune power`
    return NoMeter("n/a: no power sensor here (no NVIDIA, AMD or RAPL); `swarmtune power` says why", reasons)


Meter = SampledMeter | ModeledMeter | NoMeter  # what an engine reads each step's power from

"""Samples a sensor in a background thread at a steady cadence, and integrates it to joules.

The cadence does not drift: each wake-up is scheduled from the previous target, not from when the
last read finished. Energy over any interval comes from the cumulative series: counter deltas for
an energy sensor, the trapezoid rule for a power sensor."""

import bisect
import threading
import time
from collections.abc import Callable

from swarmtune.engine.measure.power.sensors import Sensor, SensorError


class PowerSampler:
    def __init__(self, sensor: Sensor, interval_s: float = 0.1, clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], None] = time.sleep, keep: int = 20_000) -> None:
        self.sensor = sensor
        self.interval_s = interval_s
        self.clock = clock
        self.sleep = sleep
        self.keep = keep
        self.times: list[float] = []
        self.joules: list[float] = []  # cumulative since the first sample
        self.watts_now: float | None = None
        self.error: str | None = None
        self._origin: float | None = None  # energy sensors: the counter at the first sample
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def label(self) -> str:
        return f"measured:{self.sensor.name}"

    def sample(self) -> None:
        """One reading; the first of an energy counter only sets the origin (it has no delta yet)."""
        t = self.clock()
        try:
            v = self.sensor.read()
        except SensorError as e:
            self.error = str(e)
            return
        except Exception as e:  # a library's own error must not end the sampling thread in silence
            self.error = f"{self.sensor.name} read failed: {type(e).__name__}: {e}"
            return
        self.error = None
        with self._lock:
            if self.sensor.kind == "energy":
                if self._origin is None:
                    self._origin = v
                cum = v - self._origin
                if self.times and t > self.times[-1]:
                    self.watts_now = (cum - self.joules[-1]) / (t - self.times[-1])
            else:
                cum = 0.0
                if self.times:
                    cum = self.joules[-1] + 0.5 * (v + (self.watts_now or v)) * (t - self.times[-1])
                self.watts_now = v
            self.times.append(t)
            self.joules.append(cum)
            if len(self.times) > self.keep:
                del self.times[: len(self.times) - self.keep]
                del self.joules[: len(self.joules) - self.keep]

    def run(self, n: int | None = None) -> None:
        """The sampling loop; `n` bounds it (tests), else it runs until stop()."""
        next_t = self.clock()
        count = 0
        while not self._stop.is_set() and (n is None or count < n):
            self.sample()
            count += 1
            next_t += self.interval_s
            self.sleep(max(0.0, next_t - self.clock()))

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="power-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def _cum_at(self, t: float) -> float | None:
        ts, js = self.times, self.joules
        if len(ts) < 2 or t < ts[0]:
            return None
        i = bisect.bisect_right(ts, t)
        if i >= len(ts):  # past the last sample: extend at the latest rate
            return js[-1] + (self.watts_now or 0.0) * (t - ts[-1])
        t0, t1 = ts[i - 1], ts[i]
        return js[i - 1] + (js[i] - js[i - 1]) * (t - t0) / (t1 - t0)

    def energy_between(self, t0: float, t1: float) -> float | None:
        """Joules between two clock times, or None before the sensor has two samples covering t0."""
        with self._lock:
            a, b = self._cum_at(t0), self._cum_at(t1)
        if a is None or b is None:
            return None
        return max(0.0, b - a)

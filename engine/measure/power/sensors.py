"""Power sensors. Each reads either watts now (`kind == "power"`) or a cumulative energy counter in
joules (`kind == "energy"`). A sensor that is missing says why; one that fails raises SensorError,
which the sampler turns into "n/a" with the reason, never a zero.

The vendor libraries fail in ways of their own (pyamdgpuinfo 2.1.8 raises FileNotFoundError for
/dev/dri/ on a machine without an AMD driver; pynvml raises NVMLError_LibraryNotFound): every call
into one goes through `_library_call`, so whatever it raises becomes a SensorError with the reason."""

import glob
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

DEFAULT_SYSFS = "/sys"


class SensorError(Exception):
    pass


T = TypeVar("T")


def _reason(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _library_call(what: str, fn: Callable[[], T]) -> T:
    """fn(), with anything a sensor library raises turned into a SensorError naming the call."""
    try:
        return fn()
    except SensorError:
        raise
    except Exception as e:
        raise SensorError(f"{what} failed: {_reason(e)}") from None


def _import(module: str, package: str) -> Any:
    """A sensor library, or a SensorError: not installed, or installed but failing to load (a missing .so)."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        if getattr(e, "name", None) == module:
            raise SensorError(f"{package} is not installed") from None
        raise SensorError(f"{package} does not load: {_reason(e)}") from None
    except Exception as e:
        raise SensorError(f"{package} does not load: {_reason(e)}") from None


class Sensor(Protocol):
    name: str
    kind: str  # power | energy

    def read(self) -> float:
        """Watts (power) or joules since some origin (energy)."""


@dataclass(frozen=True)
class Availability:
    name: str
    available: bool
    reason: str


def sysfs_root() -> str:
    return os.environ.get("SWARMTUNE_SYSFS_ROOT", DEFAULT_SYSFS)


def _read_int(path: str) -> int:
    try:
        return int(Path(path).read_text().strip())
    except PermissionError:
        raise SensorError(f"{path}: permission denied (often root only)") from None
    except (OSError, ValueError) as e:
        raise SensorError(f"{path}: {e}") from None


class RaplSensor:
    """CPU package energy: /sys/class/powercap/intel-rapl:N/energy_uj, wrapping at max_energy_range_uj."""

    name = "rapl"
    kind = "energy"

    def __init__(self, root: str | None = None) -> None:
        base = os.path.join(root or sysfs_root(), "class", "powercap")
        # top-level packages only (intel-rapl:0), not their subzones (intel-rapl:0:0), which they include
        self.zones = sorted(p for p in glob.glob(os.path.join(base, "intel-rapl:*")) if p.count(":") == 1)
        if not self.zones:
            raise SensorError(f"no RAPL package zones under {base}")
        self.ranges_uj = [_read_int(os.path.join(z, "max_energy_range_uj")) for z in self.zones]
        self._last_uj = [_read_int(os.path.join(z, "energy_uj")) for z in self.zones]
        self._total_uj = 0

    def read(self) -> float:
        for i, z in enumerate(self.zones):
            cur = _read_int(os.path.join(z, "energy_uj"))
            delta = cur - self._last_uj[i]
            if delta < 0:  # the counter wrapped
                delta += self.ranges_uj[i]
            self._total_uj += delta
            self._last_uj[i] = cur
        return self._total_uj / 1e6


def amdgpu_hwmon_files(root: str | None = None) -> list[str]:
    base = os.path.join(root or sysfs_root(), "class", "drm")
    out = []
    for hw in sorted(glob.glob(os.path.join(base, "card*", "device", "hwmon", "hwmon*"))):
        try:
            if Path(hw, "name").read_text().strip() != "amdgpu":
                continue
        except OSError:
            continue
        # a card has power1_average or power1_input (microwatts), depending on the generation
        for f in ("power1_average", "power1_input"):
            if os.path.exists(os.path.join(hw, f)):
                out.append(os.path.join(hw, f))
                break
    return out


class AmdHwmonSensor:
    name = "amdgpu-hwmon"
    kind = "power"

    def __init__(self, root: str | None = None) -> None:
        files = amdgpu_hwmon_files(root)
        if not files:
            raise SensorError("no amdgpu hwmon power1_average or power1_input file")
        self.path = files[0]
        self.read()

    def read(self) -> float:
        return _read_int(self.path) / 1e6


class PyAmdGpuInfoSensor:
    name = "pyamdgpuinfo"
    kind = "power"

    def __init__(self) -> None:
        lib = _import("pyamdgpuinfo", "pyamdgpuinfo")
        # with no AMD driver, detect_gpus() raises FileNotFoundError for /dev/dri/ rather than returning 0
        if _library_call("pyamdgpuinfo detect_gpus()", lib.detect_gpus) < 1:
            raise SensorError("pyamdgpuinfo found no AMD GPU")
        self.gpu = _library_call("pyamdgpuinfo get_gpu(0)", lambda: lib.get_gpu(0))
        self.read()

    def read(self) -> float:
        # the average-power sensor fails on some kernels (>= 6.6)
        return float(_library_call("pyamdgpuinfo query_power()", self.gpu.query_power))


class NvmlSensor:
    """The total-energy counter (mJ, Volta and newer) where the card has one, else power (mW)."""

    name = "nvml"

    def __init__(self) -> None:
        pynvml = _import("pynvml", "nvidia-ml-py (pynvml)")
        self.nvml = pynvml

        def first_gpu() -> Any:
            pynvml.nvmlInit()
            if pynvml.nvmlDeviceGetCount() < 1:
                raise SensorError("NVML found no GPU")
            return pynvml.nvmlDeviceGetHandleByIndex(0)

        self.handle = _library_call("NVML", first_gpu)
        try:
            pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
            self.kind = "energy"
        except Exception:
            self.kind = "power"
        self.read()

    def read(self) -> float:
        if self.kind == "energy":
            mj = _library_call("NVML read", lambda: self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
            return float(mj) / 1e3
        return float(_library_call("NVML read", lambda: self.nvml.nvmlDeviceGetPowerUsage(self.handle))) / 1e3


class AmdGpuSensor:
    """pyamdgpuinfo, falling back to the hwmon files when its sensor fails."""

    kind = "power"

    def __init__(self, root: str | None = None) -> None:
        self.primary: PyAmdGpuInfoSensor | None = None
        self.fallback: AmdHwmonSensor | None = None
        reasons = []
        try:
            self.primary = PyAmdGpuInfoSensor()
        except SensorError as e:
            reasons.append(str(e))
        try:
            self.fallback = AmdHwmonSensor(root)
        except SensorError as e:
            reasons.append(str(e))
        if self.primary is None and self.fallback is None:
            raise SensorError("; ".join(reasons))
        self.name = self.primary.name if self.primary else self.fallback.name  # type: ignore[union-attr]

    def read(self) -> float:
        if self.primary is not None:
            try:
                return self.primary.read()
            except SensorError:
                if self.fallback is None:
                    raise
                self.primary = None  # it failed once; it fails on this kernel
                self.name = self.fallback.name
        assert self.fallback is not None
        return self.fallback.read()


SENSORS = ("nvml", "amdgpu", "rapl")


def open_sensor(name: str, root: str | None = None) -> Sensor:
    """The named sensor, read once; SensorError with the reason for any failure, whatever raised it."""
    opener: dict[str, Callable[[], Sensor]] = {
        "nvml": NvmlSensor, "amdgpu": lambda: AmdGpuSensor(root), "rapl": lambda: RaplSensor(root),
    }
    if name not in opener:
        raise SensorError(f"unknown power source {name!r}")
    return _library_call(name, opener[name])


def survey(root: str | None = None) -> list[Availability]:
    out = []
    for name in SENSORS:
        try:
            s = open_sensor(name, root)
            out.append(Availability(name, True, f"reads {s.kind} via {s.name}"))
        except SensorError as e:
            out.append(Availability(name, False, str(e)))
    return out

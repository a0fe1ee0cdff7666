"""Power sensors. Each reads either watts now (`kind == "power"`) or a cumulative energy counter in
joules (`kind == "energy"`). A sensor that is missing says why; one that fails raises SensorError,
which the sampler turns into "n/a" with the reason, never a zero."""

import glob
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

DEFAULT_SYSFS = "/sys"


class SensorError(Exception):
    pass


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
        try:
            import pyamdgpuinfo
        except ImportError:
            raise SensorError("pyamdgpuinfo is not installed") from None
        if pyamdgpuinfo.detect_gpus() < 1:
            raise SensorError("pyamdgpuinfo found no AMD GPU")
        self.gpu = pyamdgpuinfo.get_gpu(0)
        self.read()

    def read(self) -> float:
        try:
            return float(self.gpu.query_power())
        except Exception as e:  # the average-power sensor fails on some kernels (>= 6.6)
            raise SensorError(f"pyamdgpuinfo query_power failed: {e}") from None


class NvmlSensor:
    """The total-energy counter (mJ, Volta and newer) where the card has one, else power (mW)."""

    name = "nvml"

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError:
            raise SensorError("nvidia-ml-py (pynvml) is not installed") from None
        self.nvml = pynvml
        try:
            pynvml.nvmlInit()
            if pynvml.nvmlDeviceGetCount() < 1:
                raise SensorError("NVML found no GPU")
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except SensorError:
            raise
        except Exception as e:
            raise SensorError(f"NVML unavailable: {e}") from None
        try:
            pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
            self.kind = "energy"
        except Exception:
            self.kind = "power"
        self.read()

    def read(self) -> float:
        try:
            if self.kind == "energy":
                return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1e3
            return self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1e3
        except Exception as e:
            raise SensorError(f"NVML read failed: {e}") from None


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
    if name == "nvml":
        return NvmlSensor()
    if name == "amdgpu":
        return AmdGpuSensor(root)
    if name == "rapl":
        return RaplSensor(root)
    raise SensorError(f"unknown power source {name!r}")


def survey(root: str | None = None) -> list[Availability]:
    out = []
    for name in SENSORS:
        try:
            s = open_sensor(name, root)
            out.append(Availability(name, True, f"reads {s.kind} via {s.name}"))
        except SensorError as e:
            out.append(Availability(name, False, str(e)))
    return out

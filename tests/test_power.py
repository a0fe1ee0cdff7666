"""Power sensors against fake sysfs trees (real file names and formats), stand-in NVML and pyamdgpuinfo
modules with the real function names, and the real pyamdgpuinfo package on a machine without an AMD
GPU; the sampler's cadence with an injected clock; the energy ledger."""

import importlib.util
import os
import sys
import types

import pytest

from swarmtune.engine.backends.sim_backend import SimBackend
from swarmtune.engine.errors import UserError
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.measure.power.ledger import EnergyLedger
from swarmtune.engine.measure.power.meter import ModeledMeter, NoMeter, SampledMeter, make_meter
from swarmtune.engine.measure.power.sampler import PowerSampler
from swarmtune.engine.measure.power.sensors import (
    AmdGpuSensor,
    AmdHwmonSensor,
    NvmlSensor,
    PyAmdGpuInfoSensor,
    RaplSensor,
    SensorError,
    open_sensor,
    survey,
)
from swarmtune.engine.measure.sweep import run_sweep
from swarmtune.engine.model.profiles import profile
from tests.conftest import SIM, run_cli

KV = KVSetting.parse  # a KV setting as a flag spells it


def rapl_tree(root, energy_uj: int, max_uj: int = 262143328850):
    z = root / "class" / "powercap" / "intel-rapl:0"
    z.mkdir(parents=True, exist_ok=True)
    (z / "name").write_text("package-0\n")
    (z / "energy_uj").write_text(f"{energy_uj}\n")
    (z / "max_energy_range_uj").write_text(f"{max_uj}\n")
    sub = root / "class" / "powercap" / "intel-rapl:0:0"  # a subzone: included in the package, not added
    sub.mkdir(exist_ok=True)
    (sub / "energy_uj").write_text("5\n")
    (sub / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return z


def hwmon_tree(root, filename: str, microwatts: int, name: str = "amdgpu"):
    hw = root / "class" / "drm" / "card0" / "device" / "hwmon" / "hwmon3"
    hw.mkdir(parents=True, exist_ok=True)
    (hw / "name").write_text(f"{name}\n")
    (hw / filename).write_text(f"{microwatts}\n")
    return hw


def test_rapl_counts_energy_and_survives_wraparound(tmp_path):
    z = rapl_tree(tmp_path, energy_uj=1_000_000, max_uj=10_000_000)
    s = RaplSensor(str(tmp_path))
    assert s.zones == [str(z)]
    (z / "energy_uj").write_text("4000000\n")
    assert s.read() == pytest.approx(3.0)
    (z / "energy_uj").write_text("500000\n")  # wrapped: 4.0 J -> 10.0 J -> 0.5 J
    assert s.read() == pytest.approx(3.0 + 6.5)


def test_rapl_permission_and_absence(tmp_path):
    with pytest.raises(SensorError, match="no RAPL"):
        RaplSensor(str(tmp_path))
    z = rapl_tree(tmp_path, 1)
    (z / "energy_uj").chmod(0)
    import os
    if os.geteuid() != 0:  # root reads anything
        with pytest.raises(SensorError, match="permission"):
            RaplSensor(str(tmp_path))


@pytest.mark.parametrize("filename", ["power1_average", "power1_input"])
def test_amdgpu_hwmon_reads_either_file_in_microwatts(tmp_path, filename):
    hwmon_tree(tmp_path, filename, 187_000_000)
    s = AmdHwmonSensor(str(tmp_path))
    assert s.read() == pytest.approx(187.0) and s.kind == "power"


def test_hwmon_of_another_driver_is_not_amdgpu(tmp_path):
    hwmon_tree(tmp_path, "power1_average", 5_000_000, name="nvme")
    with pytest.raises(SensorError):
        AmdHwmonSensor(str(tmp_path))


def fake_pyamdgpuinfo(monkeypatch, readings, detect=lambda: 1):
    """The real module's names: detect_gpus(), get_gpu(i).query_power(); readings may hold exceptions."""
    mod = types.ModuleType("pyamdgpuinfo")

    class GPU:
        def query_power(self):
            v = readings.pop(0) if len(readings) > 1 else readings[0]
            if isinstance(v, Exception):
                raise v
            return v

    mod.detect_gpus = detect
    mod.get_gpu = lambda i: GPU()
    monkeypatch.setitem(sys.modules, "pyamdgpuinfo", mod)


def test_pyamdgpuinfo_first_then_hwmon_when_it_fails(tmp_path, monkeypatch):
    hwmon_tree(tmp_path, "power1_input", 99_000_000)
    fake_pyamdgpuinfo(monkeypatch, [150.0, 151.0, RuntimeError("average power sensor not supported")])
    s = AmdGpuSensor(str(tmp_path))
    assert s.name == "pyamdgpuinfo" and s.read() == 151.0
    assert s.read() == pytest.approx(99.0) and s.name == "amdgpu-hwmon"  # the kernel >= 6.6 case


def test_pyamdgpuinfo_failing_from_the_start(tmp_path, monkeypatch):
    hwmon_tree(tmp_path, "power1_average", 80_000_000)
    fake_pyamdgpuinfo(monkeypatch, [RuntimeError("no sensor")])
    s = AmdGpuSensor(str(tmp_path))
    assert s.name == "amdgpu-hwmon" and s.read() == pytest.approx(80.0)


def no_dri():
    raise FileNotFoundError(2, "No such file or directory", "/dev/dri/")  # what 2.1.8 raises with no driver


def test_pyamdgpuinfo_raising_anything_reads_na(tmp_path, monkeypatch):
    fake_pyamdgpuinfo(monkeypatch, [1.0], detect=no_dri)
    with pytest.raises(SensorError, match="detect_gpus.*FileNotFoundError.*/dev/dri/"):
        PyAmdGpuInfoSensor()
    fake_pyamdgpuinfo(monkeypatch, [1.0], detect=lambda: 0)
    with pytest.raises(SensorError, match="no AMD GPU"):
        PyAmdGpuInfoSensor()
    hwmon_tree(tmp_path, "power1_average", 80_000_000)  # the driver's own files still serve
    fake_pyamdgpuinfo(monkeypatch, [1.0], detect=no_dri)
    s = AmdGpuSensor(str(tmp_path))
    assert s.name == "amdgpu-hwmon" and s.read() == pytest.approx(80.0)


def test_a_sensor_library_that_fails_to_load_reads_na(tmp_path, monkeypatch):
    (tmp_path / "pyamdgpuinfo.py").write_text("raise OSError('libdrm_amdgpu.so.1: cannot open shared object file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "pyamdgpuinfo", raising=False)
    with pytest.raises(SensorError, match="does not load.*libdrm"):
        open_sensor("amdgpu", str(tmp_path))
    monkeypatch.setitem(sys.modules, "pyamdgpuinfo", None)  # how Python marks a module absent
    with pytest.raises(SensorError, match="not installed"):
        PyAmdGpuInfoSensor()


@pytest.mark.skipif(importlib.util.find_spec("pyamdgpuinfo") is None, reason="pyamdgpuinfo not installed")
@pytest.mark.skipif(os.path.exists("/dev/dri"), reason="this machine has a GPU driver")
def test_real_pyamdgpuinfo_without_an_amd_gpu(tmp_path):
    """The real 2.1.8 wheel on a machine with no /dev/dri: n/a with the reason, never a crash."""
    import pyamdgpuinfo

    with pytest.raises(FileNotFoundError):  # what the package does; if this changes, so may the reason
        pyamdgpuinfo.detect_gpus()
    with pytest.raises(SensorError, match="detect_gpus.*/dev/dri"):
        PyAmdGpuInfoSensor()
    got = {a.name: a for a in survey(str(tmp_path))}
    assert not got["amdgpu"].available and "FileNotFoundError" in got["amdgpu"].reason
    m = make_meter("auto", None, root=str(tmp_path))
    # the panel's line speaks to a person; the sensors' own failures are kept for `swarmtune power`
    assert isinstance(m, NoMeter) and m.reason.startswith("n/a: no power sensor here") and "Error" not in m.reason
    assert any(t.startswith("amdgpu: pyamdgpuinfo") for t in m.tried)
    with pytest.raises(UserError, match="amdgpu is not available: pyamdgpuinfo"):
        make_meter("amdgpu", None, root=str(tmp_path))
    out = run_cli("power", "--sysfs-root", str(tmp_path))
    assert out.returncode == 0 and "internal error" not in out.stderr, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("amdgpu"))
    assert line.split()[1] == "n/a" and "/dev/dri" in line
    hwmon_tree(tmp_path, "power1_input", 42_000_000)  # with the driver's files, they are read instead
    assert AmdGpuSensor(str(tmp_path)).read() == pytest.approx(42.0)


def fake_nvml(monkeypatch, energy_mj=None, power_mw=200_000):
    mod = types.ModuleType("pynvml")
    state = {"e": energy_mj}
    mod.nvmlInit = lambda: None
    mod.nvmlDeviceGetCount = lambda: 1
    mod.nvmlDeviceGetHandleByIndex = lambda i: object()

    def energy(h):
        if state["e"] is None:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return state["e"]

    mod.nvmlDeviceGetTotalEnergyConsumption = energy
    mod.nvmlDeviceGetPowerUsage = lambda h: power_mw
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    return state


def test_nvml_prefers_the_energy_counter(monkeypatch):
    state = fake_nvml(monkeypatch, energy_mj=5_000)
    s = NvmlSensor()
    assert s.kind == "energy" and s.read() == pytest.approx(5.0)
    state["e"] = 7_500
    assert s.read() == pytest.approx(7.5)


def test_nvml_falls_back_to_power(monkeypatch):
    fake_nvml(monkeypatch, energy_mj=None, power_mw=123_000)
    s = NvmlSensor()
    assert s.kind == "power" and s.read() == pytest.approx(123.0)


def test_nvml_without_a_driver_reads_na(monkeypatch, tmp_path):
    fake_nvml(monkeypatch)

    class NVMLError_LibraryNotFound(Exception):  # noqa: N801 (pynvml's own name)
        def __str__(self):
            return "NVML Shared Library Not Found"

    def init():
        raise NVMLError_LibraryNotFound()

    sys.modules["pynvml"].nvmlInit = init
    with pytest.raises(SensorError, match="NVML.*Shared Library Not Found"):
        NvmlSensor()
    assert not {a.name: a for a in survey(str(tmp_path))}["nvml"].available


class Clock:
    def __init__(self):
        self.t = 0.0
        self.slept = []

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.slept.append(s)
        self.t += s


class SlowSensor:
    """Each read takes 30 ms of the injected clock; power ramps 100 W, 110 W, ..."""
    name = "fake"
    kind = "power"

    def __init__(self, clock):
        self.clock, self.n = clock, 0

    def read(self):
        self.clock.t += 0.03
        self.n += 1
        return 100.0 + 10 * (self.n - 1)


def test_sampler_cadence_does_not_drift():
    c = Clock()
    s = PowerSampler(SlowSensor(c), interval_s=0.1, clock=c, sleep=c.sleep)
    s.run(n=50)
    assert c.slept[0] == pytest.approx(0.07)
    # 50 intervals end at 5.0 s exactly, despite each read costing 30 ms
    assert c.t == pytest.approx(5.0)
    assert s.times[-1] == pytest.approx(4.9)


def test_trapezoid_energy_and_first_sample():
    c = Clock()
    s = PowerSampler(SlowSensor(c), interval_s=1.0, clock=c, sleep=c.sleep)
    s.sample()
    assert s.energy_between(0.0, 0.5) is None  # one sample: no delta yet
    c.t = 1.0
    s.sample()  # 110 W at t=1.0; 100 W at t=0.0
    assert s.energy_between(0.0, 1.0) == pytest.approx(105.0)
    meter = SampledMeter(s)
    p = meter.step(0.0, 1.0, 4, 1.0)
    assert p.source == "measured:fake" and p.watts == pytest.approx(105.0)


def test_energy_counter_sampler_uses_deltas():
    c = Clock()

    class Counter:
        name, kind = "rapl", "energy"
        v = 1000.0

        def read(self):
            return self.v

    cnt = Counter()
    s = PowerSampler(cnt, clock=c, sleep=c.sleep)
    s.sample()
    c.t, cnt.v = 2.0, 1300.0
    s.sample()
    assert s.energy_between(0.0, 2.0) == pytest.approx(300.0) and s.watts_now == pytest.approx(150.0)


def test_failing_sensor_reads_na_not_zero():
    class Broken:
        name, kind = "broken", "power"

        def read(self):
            raise SensorError("sensor went away")

    s = PowerSampler(Broken())
    s.sample()
    assert s.error == "sensor went away" and s.energy_between(0, 1) is None
    assert SampledMeter(s).step(0, 1, 1, 1) is None


def test_a_library_error_mid_run_does_not_end_the_sampler():
    class Flaky:
        name, kind = "flaky", "power"

        def __init__(self):
            self.n = 0

        def read(self):
            self.n += 1
            if self.n == 2:
                raise OSError("device went away")
            return 100.0

    c = Clock()
    s = PowerSampler(Flaky(), interval_s=0.1, clock=c, sleep=c.sleep)
    s.run(n=2)
    assert "device went away" in s.error
    s.run(n=1)
    assert s.error is None and len(s.times) == 2


def test_meter_choice(tmp_path):
    m = make_meter("auto", profile(SIM))
    assert isinstance(m, ModeledMeter) and m.watts_at(8) == 210
    m = make_meter("auto", None, root=str(tmp_path))
    assert isinstance(m, NoMeter) and "RAPL" in m.reason and any(t.startswith("rapl: ") for t in m.tried)
    with pytest.raises(UserError):
        make_meter("bogus")
    with pytest.raises(UserError):
        make_meter("rapl", None, root=str(tmp_path))
    rapl_tree(tmp_path, 10)
    m = make_meter("rapl", None, root=str(tmp_path))
    assert isinstance(m, SampledMeter) and m.label == "measured:rapl"
    m.close()


def test_survey_names_each_source(tmp_path):
    hwmon_tree(tmp_path, "power1_average", 1)
    got = {a.name: a for a in survey(str(tmp_path))}
    assert got["amdgpu"].available and not got["rapl"].available and got["rapl"].reason
    out = run_cli("power", "--sysfs-root", str(tmp_path))
    assert out.returncode == 0 and "rapl" in out.stdout and "modeled" in out.stdout


SEED_ENERGY = {1: (3.54, 0.28), 2: (2.03, 0.49), 4: (1.29, 0.78), 8: (0.95, 1.06)}


def test_energy_ledger_reproduces_the_seed():
    p = profile(SIM)
    meter = ModeledMeter(p.power_floor_watts, p.power_per_agent_watts)
    r = run_sweep(SimBackend(p), KV("f16"), [1, 2, 4, 8], [2400], meter=meter)
    for row in r.rows:
        jpt, tpj = SEED_ENERGY[row.batch]
        assert row.joules_per_token == pytest.approx(jpt, abs=0.03)
        assert row.tokens_per_joule == pytest.approx(tpj, abs=0.03)
        assert row.power_source == "modeled"
    speedup = r.rows[-1].speedup
    energy_gain = r.rows[0].joules_per_token / r.rows[-1].joules_per_token
    assert speedup > energy_gain  # 5.6x throughput, only ~3.7x energy


def test_sweep_cli_prints_the_ledger(tmp_path):
    out = run_cli("sweep", "--sim", SIM, "--batch", "1,2,4,8", "--contexts", "2400", "--json", str(tmp_path / "e.json"))
    assert out.returncode == 0
    assert "energy ledger" in out.stdout and "3.54" in out.stdout
    import json
    rows = json.loads((tmp_path / "e.json").read_text())["rows"]
    assert all({"watts", "joules_per_token", "tokens_per_joule"} <= set(r) for r in rows)


def test_marginal_agent():
    led = EnergyLedger()
    meter = ModeledMeter(130, 10)
    m = led.marginal(4, lambda b: 0.02 + 0.001 * b, meter.watts_at)
    assert m.lowers  # a cheap step: one more agent still lowers J/token
    m = led.marginal(4, lambda b: 0.001 + 0.05 * b, meter.watts_at)
    assert not m.lowers  # compute-bound: it no longer pays


def test_sim_records_carry_modeled_power(sim_engine):
    sim_engine.meter = ModeledMeter(130, 10)
    for _ in range(100):
        r = sim_engine.step()
    assert r.power_source == "modeled" and r.watts == 130 + 10 * max(r.batch, 1)
    assert r.joules == pytest.approx(r.watts * r.seconds)


@pytest.mark.model
def test_real_sweep_measures_power_from_a_sensor(tmp_path, llama_backend):
    """A 50 W CPU: the counter file advances 50 J a second (written as RAPL writes it, microjoules)."""
    import os
    import threading
    import time

    z = rapl_tree(tmp_path, energy_uj=0, max_uj=2**40)
    stop = threading.Event()

    def burn():
        t0 = time.perf_counter()
        while not stop.is_set():
            # replace, not rewrite: a sysfs read never sees a half-written value, and neither should this
            (z / "energy_uj.tmp").write_text(f"{int((time.perf_counter() - t0) * 50e6)}\n")
            os.replace(z / "energy_uj.tmp", z / "energy_uj")
            time.sleep(0.005)

    th = threading.Thread(target=burn, daemon=True)
    th.start()
    meter = make_meter("rapl", None, root=str(tmp_path), interval_s=0.02)
    try:
        time.sleep(0.1)
        r = run_sweep(llama_backend, KV("f16"), [1, 2], [64], steps=12, meter=meter)
    finally:
        meter.close()
        stop.set()
    for row in r.rows:
        assert row.power_source == "measured:rapl" and row.source == "measured"
        assert row.watts == pytest.approx(50, rel=0.25)
        assert row.joules_per_token == pytest.approx(row.watts / row.tokens_per_second)


@pytest.mark.model
def test_record_on_the_real_engine_with_every_sensor_absent(tmp_path, monkeypatch):
    """The default --power auto on the real model, with the real pyamdgpuinfo and no GPU: the run goes on,
    its power n/a with the reasons."""
    import json

    monkeypatch.setenv("SWARMTUNE_SYSFS_ROOT", str(tmp_path))  # no RAPL, no hwmon either
    out = run_cli("record", "-o", str(tmp_path / "r.jsonl"), "--steps", "3", "--agents", "2")
    assert out.returncode == 0, out.stderr
    header = json.loads((tmp_path / "r.jsonl").read_text().splitlines()[0])
    assert header["power"]["source"] is None and header["power"]["detail"].startswith("n/a: no power sensor")
    assert {t.split(":")[0] for t in header["power"]["tried"]} == {"nvml", "amdgpu", "rapl"}

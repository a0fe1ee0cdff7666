"""Bad input: one line naming the problem, exit status 2, no traceback, nothing written."""

import pytest

from swarmtune.engine.control import Control
from tests.conftest import SIM, run_cli


def _check(out, needle, tmp_path):
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "Traceback" not in out.stderr
    assert needle in lines[0]
    assert not (tmp_path / "r.jsonl").exists()


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--sim", "no-such-card"], "unknown profile"),
        (["--sim", SIM, "--kv", "fp8"], "unknown KV type"),
        (["--sim", SIM, "--batch-cap", "0"], "batch cap must be between 1 and 8 (got 0)"),
        (["--sim", SIM, "--agents", "0"], "agents must be between 1 and 256 (got 0)"),
        (["--sim", SIM, "--agents", "x"], "--agents must be a whole number"),
        (["--sim", SIM, "--ctx", "100"], "cannot hold one agent turn"),
        (["--sim", SIM, "--agents", "64", "--kv-budget-mb", "1"], "KV budget"),
        (["--sim", SIM, "--steps", "ten"], "--steps"),
        (["--sim", SIM, "--kv-budget-mb", "nan"], "--kv-budget-mb must be a number"),
        (["--sim", SIM, "--duration", "inf"], "--duration must be a number"),
        (["--sim", SIM, "--model", "x.gguf"], "not both"),
        (["--sim", SIM, "--max-stall-ms", "0"], "--max-stall-ms must be a number above 0, auto or off (got '0')"),
        (["--sim", SIM, "--max-stall-ms", "soon"], "--max-stall-ms must be a number above 0, auto or off"),
        (["--sim", SIM, "--max-stall-ms", "nan"], "--max-stall-ms must be a number above 0, auto or off"),
    ],
)
def test_bad_engine_flags(tmp_path, args, needle):
    _check(run_cli("record", *args, "-o", str(tmp_path / "r.jsonl")), needle, tmp_path)


def test_missing_model(tmp_path):
    _check(run_cli("record", "--model", str(tmp_path / "none.gguf"), "-o", str(tmp_path / "r.jsonl")),
           "model file not found", tmp_path)


def test_not_a_gguf(tmp_path):
    (tmp_path / "m.gguf").write_text("hello")
    _check(run_cli("record", "--model", str(tmp_path / "m.gguf"), "-o", str(tmp_path / "r.jsonl")),
           "not a GGUF", tmp_path)


def test_truncated_gguf(tmp_path, model_path):
    (tmp_path / "m.gguf").write_bytes(model_path.read_bytes()[:20_000_000])
    _check(run_cli("record", "--model", str(tmp_path / "m.gguf"), "-o", str(tmp_path / "r.jsonl")),
           "truncated", tmp_path)


def test_output_folder_missing(tmp_path):
    out = run_cli("record", "--sim", SIM, "--steps", "5", "-o", str(tmp_path / "no" / "r.jsonl"))
    assert out.returncode == 2 and "does not exist" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_sweep_bad_values(tmp_path):
    out = run_cli("sweep", "--sim", SIM, "--batch", "1,x")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    out = run_cli("sweep", "--sim", SIM, "--kv", "q9")
    assert out.returncode == 2 and "unknown KV type" in out.stderr


def test_one_message_wherever_a_bad_value_comes_from(sim_engine, tmp_path):
    """A flag, a dashboard key or typed command (Engine.request) and an HTTP body share engine/settings.py."""
    from swarmtune.engine.errors import UserError

    flag = run_cli("record", "--sim", SIM, "--agents", "300", "-o", str(tmp_path / "x.jsonl"))
    with pytest.raises(UserError) as typed:
        sim_engine.request(Control(agents=300))
    assert flag.stderr.strip() == f"swarmtune: {typed.value}"
    assert typed.value.field == "agents"


@pytest.mark.parametrize("args, needle", [
    (["--power", "bogus"], "unknown power source 'bogus'"),
    (["--autotune", "joules_per_token"], "the tuner forecasts power from a power model"),
    (["--ctx", "100"], "cannot hold one agent turn"),
])
def test_the_dashboard_refuses_bad_flags_before_its_screen(tmp_path, args, needle):
    """`swarmtune run` builds its engine behind the screen: every flag is still checked first, in one line."""
    _check(run_cli("run", *args), needle, tmp_path)

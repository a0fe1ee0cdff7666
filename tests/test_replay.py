"""`swarmtune replay`: play, pause, step, seek and speed; truncated and bad files."""

import pytest

from swarmtune.engine.control import Control
from swarmtune.engine.errors import UserError
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.record.records import read_recording
from swarmtune.sources.replay import ReplaySource
from swarmtune.tui.app import SwarmApp
from tests.conftest import SIM, run_cli, wait_for

KV = KVSetting.parse  # a KV setting as a flag spells it


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    path = tmp_path_factory.mktemp("rec") / "sim.jsonl"
    out = run_cli("record", "--sim", SIM, "--steps", "600", "--seed", "1", "-o", str(path))
    assert out.returncode == 0, out.stderr
    return path


async def test_replay_controls(recording):
    src = ReplaySource(read_recording(recording), speed=8)
    app = SwarmApp(src)
    async with app.run_test(size=(120, 40)) as pilot:
        assert app.mode == "REPLAY"
        assert await wait_for(pilot, lambda: app.stats.steps > 20)
        await pilot.press("space")
        assert src.paused
        assert await wait_for(pilot, lambda: app.stats.steps == src.position)  # what was in flight has arrived
        pos = src.position
        await pilot.press("full_stop")
        assert await wait_for(pilot, lambda: src.position == pos + 1)
        await pilot.press("right_square_bracket")
        assert await wait_for(pilot, lambda: src.position >= pos + 60)
        assert app.stats.steps == src.position  # the panels show everything up to the seek point
        await pilot.press("left_square_bracket")
        assert await wait_for(pilot, lambda: src.position <= pos + 1)
        await pilot.press("greater_than_sign")
        assert src.speed == 16
        await pilot.press("less_than_sign", "less_than_sign")
        assert src.speed == 4
        assert app.check_action("cycle_kv", ()) is False  # a replay has no engine controls
        with pytest.raises(UserError, match="read-only"):
            src.request(Control(kv=KV("q8_0")))
        await pilot.press("k")  # not a replay key: no engine control is offered
        assert app.stats.latest.kv_type == "f16"
        assert app.stop_engine()


async def test_replay_of_a_truncated_file(recording, tmp_path):
    data = recording.read_bytes()
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(data[:-50])
    rec = read_recording(cut)
    assert rec.skipped_partial and len(rec.steps) == 599
    src = ReplaySource(rec, speed=64)
    app = SwarmApp(src)
    async with app.run_test(size=(120, 40)) as pilot:
        assert await wait_for(pilot, lambda: src.position == 599, timeout=20)
        assert await wait_for(pilot, lambda: app.stats.steps == 599)
        assert app.stop_engine()


def test_missing_or_garbled_replay_file(tmp_path):
    out = run_cli("replay", str(tmp_path / "none.jsonl"))
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and "not found" in out.stderr
    (tmp_path / "g.jsonl").write_text("garbage\nmore garbage\n")
    out = run_cli("replay", str(tmp_path / "g.jsonl"))
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    out = run_cli("replay", str(tmp_path / "g.jsonl"), "--speed", "0")
    assert out.returncode == 2

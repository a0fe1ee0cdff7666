"""Snapshots of the main screen on deterministic sim data (a seeded recording fed to a frozen app)."""

import pytest

from swarmtune.engine.record.records import read_recording
from swarmtune.sources.replay import ReplaySource
from swarmtune.tui.app import SwarmApp
from tests.conftest import SIM, run_cli


@pytest.fixture(scope="module")
def sim_recording(tmp_path_factory):
    path = tmp_path_factory.mktemp("snap") / "sim.jsonl"
    out = run_cli("record", "--sim", SIM, "--steps", "500", "--seed", "5", "-o", str(path))
    assert out.returncode == 0, out.stderr
    rec = read_recording(path)
    rec.header["started_at"] = ""  # the only wall-clock field
    return rec


def frozen_app(rec) -> SwarmApp:
    app = SwarmApp(ReplaySource(rec), animate=False)
    return app


async def _feed(pilot, rec):
    pilot.app.source.position = len(rec.steps)
    pilot.app.feed(rec.header, rec.steps)
    await pilot.pause()


@pytest.mark.parametrize("size", [(80, 24), (160, 50)])
def test_main_screen(snap_compare, sim_recording, size):
    assert snap_compare(frozen_app(sim_recording), terminal_size=size,
                        run_before=lambda pilot: _feed(pilot, sim_recording))

"""`swarmtune replay` plays a recording made at commit 50548b5 (kept as a fixture).

The fixtures are `swarmtune record` files written by that commit's code, not edited since; how each was made
(commit, command, versions) is in tests/fixtures/README.md:

    cd <worktree of 50548b5>
    PYTHONPATH=. python -m swarmtune record --sim rx9070xt-qwen3.5-9b --agents 4 --kv q8_0/f16 \
        --steps 120 --seed 1 -o recording_50548b5_sim.jsonl
    PYTHONPATH=. python -m swarmtune record --agents 3 --kv q8_0 --steps 60 --gen-tokens 16 \
        --tool-tokens 32 --threads 1 --seed 1 -o recording_50548b5_llama.jsonl

Each is read through the path `swarmtune replay FILE` takes (the parser, `cmd_replay`, `read_recording`,
`ReplaySource`; only the terminal is swapped for Textual's headless `run_test`), checked against the file's
own lines, and played in the dashboard to its last step.
"""

import dataclasses
import json
from pathlib import Path

import pytest

from swarmtune.engine.record.records import read_recording
from swarmtune.sources.replay import ReplaySource
from swarmtune.tui.app import SwarmApp
from tests.conftest import wait_for

FIXTURES = Path(__file__).parent / "fixtures"


@dataclasses.dataclass(frozen=True)
class Made:
    """What the recording at 50548b5 was made with, and what its file holds (counted when it was made)."""

    file: str
    steps: int
    decode_steps: int
    prefill_steps: int
    agents: int
    kv: str
    backend: str
    source: str
    model: str
    ctx: int
    last_t: float


MADE = [
    Made("recording_50548b5_sim.jsonl", steps=120, decode_steps=106, prefill_steps=14, agents=4, kv="q8_0/f16",
         backend="sim", source="simulated", model="Qwen3.5-9B Q4_K_M (simulated)", ctx=16384, last_t=3.718529),
    Made("recording_50548b5_llama.jsonl", steps=60, decode_steps=48, prefill_steps=12, agents=3, kv="q8_0",
         backend="llama.cpp", source="measured", model="Smollm2 135M 8k Lc100K Mix1 Ep2", ctx=2048,
         last_t=4.483117),
]


def raw_lines(path: Path) -> list[dict]:
    """The file's lines as plain JSON, read without swarmtune."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def folded_views(step_lines: list[dict]) -> list[dict[int, dict]]:
    """Each step's agents as format 2 leaves them: a line carries only the agents whose view changed since the
    line before it, and `agents_gone` the ones that left. Written here apart from engine/record/records.py."""
    views: dict[int, dict] = {}
    out = []
    for d in step_lines:
        for a in d.get("agents", []):
            views[a["id"]] = a
        for i in d.get("agents_gone", []):
            views.pop(i, None)
        out.append(dict(views))
    return out


def replay_source_as_the_cli_builds_it(monkeypatch, path: Path, speed: str) -> ReplaySource:
    """`swarmtune replay PATH --speed S` up to the point where it would take the terminal."""
    from swarmtune.cli import COMMANDS
    from swarmtune.commands import dashboard
    from swarmtune.parsing import build_parser

    taken: list = []

    def dashboard_of(source) -> int:
        taken.append(source)
        return 0

    monkeypatch.setattr(dashboard, "_dashboard", dashboard_of)
    args = build_parser().parse_args(["replay", str(path), "--speed", speed])
    assert args.command == "replay"
    assert COMMANDS["replay"](args) == 0
    assert len(taken) == 1 and isinstance(taken[0], ReplaySource)
    return taken[0]


@pytest.mark.parametrize("made", MADE, ids=lambda m: m.backend)
def test_the_old_recording_reads_as_it_was_written(made):
    path = FIXTURES / made.file
    lines = raw_lines(path)
    step_lines = [d for d in lines if d["type"] == "step"]
    assert lines[0]["type"] == "header" and len(step_lines) == len(lines) - 1 == made.steps

    rec = read_recording(path)
    assert not rec.skipped_partial
    assert len(rec.steps) == len(step_lines) == made.steps

    h = rec.header
    assert h["format"] == 2
    assert h["versions"]["swarmtune"] == "0.2.0"
    assert h["backend"] == made.backend and h["source"] == made.source
    assert h["model"]["name"] == made.model
    assert h["settings"]["agents"] == made.agents and h["settings"]["kv"] == made.kv
    assert h["settings"]["seed"] == 1 and h["settings"]["ctx_per_agent"] == made.ctx
    assert h["kv_bytes_per_token"]["f16"] > h["kv_bytes_per_token"]["q8_0"] > 0

    assert [s.step for s in rec.steps] == list(range(made.steps))
    assert [s.step for s in rec.steps] == [d["step"] for d in step_lines]
    assert [s.kind for s in rec.steps].count("decode") == made.decode_steps
    assert [s.kind for s in rec.steps].count("prefill") == made.prefill_steps
    assert {s.kv_type for s in rec.steps} == {made.kv}
    assert [s.tokens for s in rec.steps] == [d["tokens"] for d in step_lines]
    assert [s.batch_ids for s in rec.steps] == [d["batch_ids"] for d in step_lines]
    assert rec.steps[-1].t == pytest.approx(made.last_t)

    # every step's agents, whole again, as the file's delta lines say they were
    expected = folded_views(step_lines)
    for s, want in zip(rec.steps, expected, strict=True):
        assert {a.id: dataclasses.asdict(a) for a in s.agents} == want, f"step {s.step}"
    last = rec.steps[-1]
    assert sorted(a.id for a in last.agents) == list(range(made.agents))
    assert all(a.limit == made.ctx and a.generated > 0 and a.context > a.generated for a in last.agents)


@pytest.mark.parametrize("made", MADE, ids=lambda m: m.backend)
async def test_the_old_recording_plays_to_its_last_step(made, monkeypatch):
    path = FIXTURES / made.file
    src = replay_source_as_the_cli_builds_it(monkeypatch, path, "16")
    assert src.speed == 16 and len(src.rec.steps) == made.steps
    last = src.rec.steps[-1]
    want_agents = sorted((a.id, a.state, a.context, a.generated) for a in last.agents)
    app = SwarmApp(src)
    async with app.run_test(size=(160, 50)) as pilot:
        assert app.mode == "REPLAY"
        assert await wait_for(pilot, lambda: src.position == made.steps, timeout=30)
        assert await wait_for(pilot, lambda: app.stats.steps == made.steps, timeout=10)
        assert app.stats.latest is last and app.stats.latest.step == made.steps - 1
        assert app.stats.header["run_id"] == src.rec.header["run_id"]

        from swarmtune.tui.widgets.agents import AgentsTable
        from swarmtune.tui.widgets.status import StatusLine

        def status() -> str:
            content = app.screen.query_one(StatusLine).content
            return getattr(content, "plain", str(content))

        end = f"step {made.steps}/{made.steps} at 16x"
        assert await wait_for(pilot, lambda: end in status(), timeout=10), status()
        line = status()
        assert line.startswith(" REPLAY ")
        assert f"| KV {made.kv} | cap {made.agents} | {made.agents} agents" in line
        assert f"| {made.model} | {made.backend} on " in line
        assert "last line was cut" not in line

        table = app.screen.query_one(AgentsTable)
        assert await wait_for(pilot, lambda: table._agents == list(last.agents), timeout=10)
        assert sorted((a.id, a.state, a.context, a.generated) for a in table._agents) == want_agents
        drawn = table.text(150, made.agents + 1).plain.splitlines()
        assert len(drawn) == made.agents + 1 and drawn[0].split()[:4] == ["id", "state", "context", "gen"]
        for row, a in zip(drawn[1:], sorted(last.agents, key=lambda a: a.id), strict=True):
            cells = row.split()
            assert cells[0] == str(a.id) and a.state in row and str(a.generated) in cells, row
            assert f" {a.context:,}/" in row, row  # its context of its limit: 196/2,048, 383/16.4k
        assert not app._panel_errors
        assert app.stop_engine()

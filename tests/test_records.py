import json
import os
import signal
import subprocess
import sys
import time

import pytest

from swarmtune.engine.errors import UserError
from swarmtune.engine.record.records import mean_context, read_recording
from tests.conftest import ROOT, SIM, run_cli

HEADER_KEYS = {"model", "weight_bytes", "kv_bytes_per_token", "backend", "device", "versions", "settings", "source"}
STEP_KEYS = {"type", "step", "t", "kind", "batch", "batch_ids", "batch_cap", "kv_type", "agents", "weight_bytes",
             "kv_bytes", "seconds", "tokens", "watts", "joules", "power_source"}


def test_sim_recording_format(tmp_path):
    out = run_cli("record", "--sim", SIM, "--steps", "300", "-o", str(tmp_path / "r.jsonl"))
    assert out.returncode == 0, out.stderr
    lines = (tmp_path / "r.jsonl").read_text().splitlines()
    assert len(lines) == 301
    header = json.loads(lines[0])
    assert header["type"] == "header" and header["source"] == "simulated"
    assert HEADER_KEYS <= set(header)
    assert set(header["kv_bytes_per_token"]) >= {"f16", "q8_0", "q4_0"}
    steps = [json.loads(x) for x in lines[1:]]
    assert [s["step"] for s in steps] == list(range(300))
    for s in steps:
        assert STEP_KEYS <= set(s)
        assert s["kind"] in ("decode", "prefill", "rebuild")
        assert all({"id", "context", "state"} <= set(a) for a in s["agents"])
    decode = [s for s in steps if s["kind"] == "decode"]
    assert decode and all(s["source"] == "simulated" for s in steps)
    d = decode[-1]
    k = header["kv_bytes_per_token"][d["kv_type"]]
    ctx = {a["id"]: a["context"] for a in d["agents"]}
    assert d["kv_bytes"] == pytest.approx(sum(ctx[i] for i in d["batch_ids"]) * k)
    assert d["predicted_speedup"] > 1 and d["measured_speedup"] > 1
    assert "recording" in out.stderr  # progress goes to stderr


def test_truncated_last_line_is_skipped(tmp_path):
    out = run_cli("record", "--sim", SIM, "--steps", "50", "-o", str(tmp_path / "r.jsonl"))
    assert out.returncode == 0
    data = (tmp_path / "r.jsonl").read_bytes()
    (tmp_path / "cut.jsonl").write_bytes(data[:-37])
    rec = read_recording(tmp_path / "cut.jsonl")
    assert rec.skipped_partial and len(rec.steps) == 49
    full = read_recording(tmp_path / "r.jsonl")
    assert not full.skipped_partial and len(full.steps) == 50


def test_garbled_or_empty_recordings(tmp_path):
    (tmp_path / "g.jsonl").write_text('{"type":"header"}\nnot json at all\n{"type":"step"}\n')
    with pytest.raises(UserError, match="line 2"):
        read_recording(tmp_path / "g.jsonl")
    (tmp_path / "e.jsonl").write_text("")
    with pytest.raises(UserError, match="empty"):
        read_recording(tmp_path / "e.jsonl")
    (tmp_path / "n.jsonl").write_text('{"type":"step"}\n')
    with pytest.raises(UserError, match="header"):
        read_recording(tmp_path / "n.jsonl")


def test_killed_recorder_loses_at_most_the_last_line(tmp_path):
    path = tmp_path / "k.jsonl"
    p = subprocess.Popen([sys.executable, "-m", "swarmtune", "record", "--sim", SIM, "--duration", "60",
                          "-o", str(path)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while time.time() < deadline and (not path.exists() or path.stat().st_size < 200_000):
        time.sleep(0.05)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    rec = read_recording(path)
    assert len(rec.steps) > 50
    assert [s.step for s in rec.steps] == list(range(len(rec.steps)))


def test_the_mean_context_of_no_agent_is_zero():
    assert mean_context([]) == 0.0 and mean_context(iter([100, 301])) == 200.5


def test_a_step_line_reads_back_as_what_asdict_held(sim_engine):
    # to_bytes reads the fields as they are (asdict's deep copies were most of a 64-agent record's cost) and
    # writes each view once: the line must read back as the record's every field
    from dataclasses import asdict

    from swarmtune.engine.record.records import Move

    seen = 0
    for _ in range(200):
        r = sim_engine.step()
        r.moved.append(Move(agent=0, op="swap_out", bytes=1024, seconds=0.001, source="modeled", cells=3))
        old = asdict(r)
        old["tune"] = None if r.tune is None else r.tune.to_json()
        if not r.ended:
            del old["ended"]  # left out where no request ended: it reads back as the empty list
        if not r.lost_tokens:
            del old["lost_tokens"]  # left out where no history lost its cells: it reads back as 0
        if not r.drafting_s:
            del old["drafting_s"]  # left out where no draft model ran before the step
        assert json.loads(r.to_json()) == json.loads(json.dumps(old))
        seen += bool(r.agents)
    assert seen > 100


def test_a_file_line_carries_the_views_that_changed_and_reads_back_whole(sim_engine, tmp_path):
    from swarmtune.engine.record.records import RECORD_FORMAT, RecordWriter

    w = RecordWriter(tmp_path / "r.jsonl")
    w.open({"model": "sim"})
    recs = []
    for _ in range(300):
        r = sim_engine.step()
        w.write(r)
        recs.append(r)
    w.close()
    lines = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert lines[0]["format"] == RECORD_FORMAT == 2
    assert len(lines[1]["agents"]) == len(recs[0].agents)  # the first line has every agent
    # later lines only the agents whose view changed: in a decode, those in the batch (their context grew)
    partial = [(d, r) for d, r in zip(lines[1:], recs, strict=True) if len(d["agents"]) < len(r.agents)]
    assert partial, "no line left an unchanged agent out"
    for d, r in partial:
        if d["kind"] == "decode":
            assert set(r.batch_ids) <= {a["id"] for a in d["agents"]}
    back = read_recording(tmp_path / "r.jsonl").steps
    assert [s.agents for s in back] == [r.agents for r in recs]


def test_a_recording_of_format_1_still_replays(sim_engine, tmp_path):
    # recordings made before `format` was in the header: every line lists every agent, json.dumps wrote them
    from dataclasses import asdict

    recs = [sim_engine.step() for _ in range(60)]
    lines = [json.dumps({"type": "header", "model": "sim"})]
    for r in recs:
        d = asdict(r)
        d["tune"] = None
        lines.append(json.dumps(d, separators=(",", ":")))
    (tmp_path / "old.jsonl").write_text("\n".join(lines) + "\n")
    back = read_recording(tmp_path / "old.jsonl").steps
    assert [s.agents for s in back] == [r.agents for r in recs]
    assert [s.seconds for s in back] == [r.seconds for r in recs]


def test_an_agent_that_leaves_is_gone_from_the_file_too(tmp_path):
    from swarmtune.engine.record.records import AgentView, RecordWriter, StepRecord

    def rec(step: int, ids: list[int]) -> StepRecord:
        return StepRecord(step=step, t=0.0, kind="idle", batch=0, batch_ids=[], batch_cap=8, kv_type="f16",
                          agents=[AgentView(i, 10, "client", 100, 0, 0, "") for i in ids], weight_bytes=0,
                          kv_bytes=0.0, seconds=0.0, tokens=0, source="measured")

    w = RecordWriter(tmp_path / "g.jsonl")
    w.open({})
    for step, ids in enumerate([[0, 1, 2], [0, 2], [0, 2, 3], [2, 3]]):
        w.write(rec(step, ids))
    w.close()
    lines = [json.loads(x) for x in (tmp_path / "g.jsonl").read_text().splitlines()[1:]]
    assert [d["agents"] for d in lines[1:]] == [[], [{**lines[0]["agents"][0], "id": 3}], []]
    assert [d.get("agents_gone") for d in lines] == [None, [1], None, [0]]
    back = read_recording(tmp_path / "g.jsonl").steps
    assert [[a.id for a in s.agents] for s in back] == [[0, 1, 2], [0, 2], [0, 2, 3], [2, 3]]

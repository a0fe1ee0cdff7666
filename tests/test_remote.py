"""`swarmtune serve` on a real loopback port, the real client against it; attach and record --attach."""

import json
import signal
import socket
import threading
import time

import httpx
import pytest

from swarmtune.sources.client import SwarmClient
from swarmtune.sources.protocol import Sink
from swarmtune.sources.remote import RemoteSource
from tests.conftest import SIM, run_cli, until, wait_for
from tests.remote_helpers import served, start_server


@pytest.fixture(scope="module")
def sim_server():
    with served("--sim", SIM) as s:
        yield s


def test_info_state_and_metrics(sim_server):
    c = SwarmClient(sim_server.url)
    info = c.info()
    assert info["source"] == "simulated" and info["weight_bytes"] == 5.5e9 and "q8_0" in info["kv_bytes_per_token"]
    assert until(lambda: c.state()["step"] is not None)
    st = c.state()
    assert st["step"]["type"] == "step" and st["settings"]["agents"] == 8
    m = httpx.get(sim_server.url + "/metrics").text
    for name in ("swarmtune_batch_size", "swarmtune_batch_cap", "swarmtune_agents", "swarmtune_tokens_per_second",
                 "swarmtune_weight_bytes_per_step", "swarmtune_kv_bytes_per_step", "swarmtune_predicted_speedup_ratio",
                 "swarmtune_watts", "swarmtune_joules_per_token"):
        assert name in m
    assert httpx.get(sim_server.url + "/openapi.json").json()["paths"]["/v1/control"]


def test_steps_stream_and_resume(sim_server):
    c = SwarmClient(sim_server.url)
    first = list(c.steps(limit=5))
    assert [r.step for r in first] == list(range(first[0].step, first[0].step + 5))
    resumed = list(c.steps(from_step=first[-1].step + 1, limit=3))
    assert resumed[0].step == first[-1].step + 1
    r = httpx.get(sim_server.url + "/v1/steps", params={"limit": 2}, headers={"Last-Event-ID": str(first[1].step)})
    ids = [int(x.split(":")[1]) for x in r.text.splitlines() if x.startswith("id:")]
    assert ids == [first[1].step + 1, first[1].step + 2]


def test_control_and_invalid_bodies(sim_server):
    c = SwarmClient(sim_server.url)
    s = c.control(batch_cap=3)
    assert s["batch_cap"] == 3
    for body, field in (({"batch_cap": 0}, "batch_cap"), ({"kv_type": "fp8"}, "kv_type"), ({"agents": "x"}, "agents"),
                        ({"bogus": 1}, "bogus"), ({"batch_cap": 99}, "batch_cap")):
        r = httpx.post(sim_server.url + "/v1/control", json=body)
        assert r.status_code == 422, body
        assert field in json.dumps(r.json()["detail"])
    assert c.state()["settings"]["batch_cap"] == 3  # unaffected
    # the engine's own words, as from a flag or a key
    r = httpx.post(sim_server.url + "/v1/control", json={"agents": 300})
    assert r.json()["detail"][0] == {"loc": ["body", "agents"], "msg": "agents must be between 1 and 256 (got 300)",
                                     "type": "value_error"}
    s = c.control(paused=True)
    assert s["paused"]
    n = c.state()["step"]["step"]
    time.sleep(0.5)  # a negative check: no step may come while paused
    assert c.state()["step"]["step"] == n
    c.control(paused=False, batch_cap=8)
    # residency and the tuner: the serve command's engine has one, off until asked
    s = c.control(residency="swap", autotune=True)
    assert s["residency"] == "swap" and s["autotune"] is True
    assert c.state()["settings"]["autotune"] is True
    r = httpx.post(sim_server.url + "/v1/control", json={"residency": "far"})
    assert r.status_code == 422 and "residency must be one of keep, swap, drop" in json.dumps(r.json()["detail"])
    r = httpx.post(sim_server.url + "/v1/control", json={"autotune": "yes"})
    assert r.status_code == 422 and "autotune" in json.dumps(r.json()["detail"])
    c.control(residency="keep", autotune=False)
    # speculation: a length or auto, in the engine's words when out of range
    assert c.control(draft=4)["draft"] == 4 and c.control(draft="auto")["draft"] == "auto"
    assert c.state()["settings"]["draft"] == "auto"
    for bad, says in ((99, "draft length must be between 0 and 16 (got 99)"), ("often", "draft"), (1.5, "draft")):
        r = httpx.post(sim_server.url + "/v1/control", json={"draft": bad})
        assert r.status_code == 422 and says in json.dumps(r.json()["detail"]), r.text
    assert c.control(draft=0)["draft"] == 0


def test_a_pause_holds_at_once_while_the_tuner_looks(sim_server):
    # the tuner's look forecasts a simulated swarm for seconds within one step, and a residency switch makes
    # the next simulated steps long: neither may hold up a pause (CI saw one answer after the client's 10 s)
    c = SwarmClient(sim_server.url)
    c.control(agents=64, residency="swap")
    time.sleep(0.3)
    c.control(autotune=True)
    time.sleep(0.1)  # its first look starts on the next record and runs for seconds
    t0 = time.perf_counter()
    assert c.control(paused=True)["paused"]
    assert time.perf_counter() - t0 < 2.0
    c.control(paused=False, residency="keep", agents=8, autotune=False)


def test_a_stuck_client_cannot_stall_the_engine(sim_server):
    host, port = sim_server.url.split("//")[1].split(":")
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(f"GET /v1/steps HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())  # and never read
    c = SwarmClient(sim_server.url)
    n0 = c.state()["step"]["step"]
    assert until(lambda: c.state()["step"]["step"] > n0 + 30, timeout=10)
    sock.close()


async def test_a_slow_reader_loses_the_oldest_not_the_engine():
    """The per-client queue is bounded: a reader that does not keep up loses the oldest records."""
    import asyncio

    from swarmtune.engine.backends.sim_backend import SimBackend
    from swarmtune.engine.engine import Engine, EngineSettings
    from swarmtune.engine.model.profiles import profile
    from swarmtune.server.runner import EngineRunner

    runner = EngineRunner(Engine(SimBackend(profile(SIM)), EngineSettings(ctx_per_agent=4096, reference=False)),
                          queue_size=8, pace_sim=False)
    sub = runner.subscribe(asyncio.get_running_loop())
    runner.start()
    await asyncio.sleep(1.0)  # the engine runs thousands of steps; nobody reads
    runner.stop()
    await asyncio.sleep(0.1)
    assert runner.rolling.steps_total > 500  # never stalled
    items = [sub.queue.get_nowait() for _ in range(sub.queue.qsize())]
    assert len(items) == 8 and sub.dropped > 400
    assert items[-1][0] == runner.latest.step  # the newest are kept; the reader sees the gap in step indexes


def test_the_client_reports_a_gap():
    class Gappy:
        url = "x"

        def info(self):
            return {"run_id": "a"}

        def state(self):
            return {"settings": {"batch_cap": 8, "kv_type": "f16", "agents": 8, "paused": False}}

        def steps(self, from_step=None):
            from swarmtune.engine.record.records import StepRecord
            for i in (0, 1, 2, 7, 8):
                yield StepRecord(step=i, t=i, kind="decode", batch=1, batch_ids=[0], batch_cap=8, kv_type="f16",
                                 agents=[], weight_bytes=0, kv_bytes=0, seconds=1, tokens=1, source="simulated")
            raise httpx.ConnectError("gone")

        def close(self):
            pass

    src = RemoteSource(Gappy())
    seen = []
    src.run(Sink(records=seen.extend), cancelled=lambda: src.reconnects > 0)
    assert src.missed == 4 and src.reconnects == 1


def test_token_required_off_loopback_and_checked(tmp_path):
    out = run_cli("serve", "--sim", SIM, "--host", "0.0.0.0", "--port", "0")
    assert out.returncode == 2 and "token" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    with served("--sim", SIM, "--token", "s3cret") as s:
        assert httpx.get(s.url + "/v1/info").status_code == 401
        assert httpx.get(s.url + "/v1/info", headers={"Authorization": "Bearer nope"}).status_code == 401
        assert httpx.post(s.url + "/v1/control", json={"batch_cap": 2}).status_code == 401
        assert httpx.get(s.url + "/openapi.json").status_code == 401
        assert httpx.get(s.url + "/metrics").status_code == 200
        c = SwarmClient(s.url, token="s3cret")
        assert c.info()["source"] == "simulated"
        assert c.state()["settings"]["batch_cap"] == 8  # the refused control changed nothing


def test_sigterm_stops_cleanly():
    s = start_server("--sim", SIM)
    httpx.get(s.url + "/v1/info")
    assert s.stop(signal.SIGTERM) == 0


def test_attach_reconnects_after_the_server_dies_and_resumes():
    s = start_server("--sim", SIM)
    port = int(s.url.rsplit(":", 1)[1])
    src = RemoteSource(SwarmClient(s.url), max_backoff_s=0.5)
    got: list[int] = []
    statuses: list[str] = []
    stop = threading.Event()

    def emit(recs):
        got.extend(r.step for r in recs)
        statuses.append(src.status)

    t = threading.Thread(target=src.run, kwargs=dict(sink=Sink(records=emit), cancelled=stop.is_set), daemon=True)
    t.start()
    assert until(lambda: len(got) >= 20)
    s.stop(signal.SIGKILL)  # mid-stream
    assert until(lambda: any(x.startswith("disconnected, retrying") for x in statuses))
    before = len(got)
    s2 = start_server("--sim", SIM, port=port)
    try:
        assert until(lambda: len(got) >= before + 20, timeout=30) and src.reconnects >= 1
    finally:
        stop.set()
        src.close()
        s2.stop(signal.SIGKILL)


def test_record_attach(sim_server, tmp_path):
    out = run_cli("record", "--attach", sim_server.url, "--steps", "30", "-o", str(tmp_path / "r.jsonl"))
    assert out.returncode == 0, out.stderr
    lines = (tmp_path / "r.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["attached"] == sim_server.url and len(lines) == 31


def test_serve_on_a_taken_port_is_one_line(sim_server):
    port = sim_server.url.rsplit(":", 1)[1]
    out = run_cli("serve", "--sim", SIM, "--port", port)
    assert out.returncode == 2 and "cannot listen" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_attach_to_nothing_is_one_line(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    out = run_cli("attach", f"http://127.0.0.1:{port}")
    assert out.returncode == 2 and "cannot reach" in out.stderr and len(out.stderr.strip().splitlines()) == 1


@pytest.mark.model
def test_serve_the_default_model():
    with served("--agents", "2", "--ctx", "512", "--no-reference", "--threads", "2") as s:
        c = SwarmClient(s.url)
        info = c.info()
        assert info["backend"] == "llama.cpp" and info["source"] == "measured"
        recs = list(c.steps(limit=10))
        assert len(recs) == 10 and all(r.source == "measured" for r in recs)
        assert c.control(batch_cap=1)["batch_cap"] == 1
        assert s.stop() == 0


async def test_dashboard_attached_to_a_server(sim_server):
    from swarmtune.tui.app import SwarmApp

    src = RemoteSource(SwarmClient(sim_server.url))
    app = SwarmApp(src)
    async with app.run_test(size=(120, 40)) as pilot:
        assert await wait_for(pilot, lambda: app.stats.latest_decode is not None)
        assert app.mode == "REMOTE" and app.stats.header["source"] == "simulated"
        cap = src.state().batch_cap
        await pilot.press("minus")
        assert await wait_for(pilot, lambda: app.stats.latest.batch_cap == cap - 1)
        assert SwarmClient(sim_server.url).state()["settings"]["batch_cap"] == cap - 1
        await pilot.press("plus")
        assert await wait_for(pilot, lambda: app.stats.latest.batch_cap == cap)
        assert app.stop_engine()

"""Attach to engines people already run, read-only. A transcript recorded from a real llama-server is
replayed by a real HTTP server (tests/fixture_server.py); stand-ins serve the real endpoints, field names
and metric names of llama-server and vLLM on a loopback port, and move only the counters a real server
moves while requests run (llama-server's tokens_predicted_total only at a task's end)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from swarmtune.engine.measure.speedup import predicted_speedup
from swarmtune.sources.attached import ForeignSource
from swarmtune.sources.pollers import (
    LlamaServerPoller,
    SlotReading,
    VllmPoller,
    detect,
    estimate_vllm_context,
    parse_metrics,
    parse_samples,
    slot_delta,
)
from swarmtune.tui.app import SwarmApp
from tests import fixture_server
from tests.conftest import run_cli

LLAMA_METRICS = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total {prompt}
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 1000
# TYPE llamacpp:tokens_predicted_seconds_total counter
llamacpp:tokens_predicted_seconds_total 12.5
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total {decodes}
# TYPE llamacpp:n_busy_slots_per_decode counter
llamacpp:n_busy_slots_per_decode 1.8
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 0
"""

VLLM_METRICS = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="Qwen/Qwen3-8B"}} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{model_name="Qwen/Qwen3-8B"}} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{model_name="Qwen/Qwen3-8B"}} 0.42
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{{model_name="Qwen/Qwen3-8B"}} {gen}
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{{model_name="Qwen/Qwen3-8B"}} 5000.0
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{{le="1.0",model_name="Qwen/Qwen3-8B"}} 0.0
vllm:iteration_tokens_total_bucket{{le="8.0",model_name="Qwen/Qwen3-8B"}} {steps}
vllm:iteration_tokens_total_bucket{{le="+Inf",model_name="Qwen/Qwen3-8B"}} {steps}
vllm:iteration_tokens_total_count{{model_name="Qwen/Qwen3-8B"}} {steps}
vllm:iteration_tokens_total_sum{{model_name="Qwen/Qwen3-8B"}} {gen}
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="16",cache_dtype="auto",enable_prefix_caching="True",num_cpu_blocks="None",\
num_gpu_blocks="2503",num_gpu_blocks_override="None",sliding_window="None"}} 1.0
"""
VLLM_BLOCKS, VLLM_BLOCK_TOKENS = 2503, 16


def slots(steps: int):
    """Two slots decoding in lockstep (one token each per step) and one never used, shaped as the recorded
    server shows them: while a task runs, n_prompt_tokens counts its decoded tokens too."""
    def busy(sid: int, task: int, cached: int, processed: int, decoded: int) -> dict:
        return {"id": sid, "n_ctx": 4096, "speculative": False, "is_processing": True, "id_task": task,
                "n_prompt_tokens": cached + processed + decoded, "n_prompt_tokens_processed": processed,
                "n_prompt_tokens_cache": cached, "params": {"temperature": 0.8},
                "next_token": [{"has_next_token": True, "has_new_line": False, "n_remain": -1, "n_decoded": decoded}]}
    return [busy(0, 7, 1500, 300, 40 + steps), busy(1, 8, 0, 900, 10 + steps),
            {"id": 2, "n_ctx": 4096, "speculative": False, "is_processing": False}]


class StandIn(BaseHTTPRequestHandler):
    kind = "llama-server"
    polls = 0

    def log_message(self, *a):
        pass

    def _send(self, code: int, body: str, ctype: str = "application/json"):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        cls = type(self)
        cls.polls += 1
        p = self.path.split("?")[0]
        if cls.kind == "llama-server":
            if p == "/slots":
                return self._send(200, json.dumps(slots(40 + cls.polls)))
            if p == "/props":
                return self._send(200, json.dumps({"model_path": "/models/Qwen3.5-9B-Q4_K_M.gguf", "total_slots": 3,
                                                   "default_generation_settings": {"n_ctx": 4096}}))
            if p == "/metrics":
                return self._send(200, LLAMA_METRICS.format(prompt=5000, decodes=900 + cls.polls),
                                  "text/plain; version=0.0.4")
        else:
            if p == "/metrics":  # three running requests: 10 steps, 30 tokens a poll
                return self._send(200, VLLM_METRICS.format(gen=2000.0 + 30 * cls.polls, steps=700 + 10 * cls.polls),
                                  "text/plain; version=0.0.4")
            if p == "/v1/models":
                return self._send(200, json.dumps({"data": [{"id": "Qwen/Qwen3-8B", "max_model_len": 32768}]}))
        return self._send(404, json.dumps({"error": "not found"}))


@pytest.fixture(params=["llama-server", "vllm"])
def stand_in(request):
    handler = type("H", (StandIn,), {"kind": request.param, "polls": 0})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield request.param, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_detect_and_poll(stand_in):
    kind, url = stand_in
    assert detect(url) == kind
    poller = (LlamaServerPoller if kind == "llama-server" else VllmPoller)(url, 5.5e9, 147e3)
    first, second = poller.poll(), poller.poll()
    assert second.source == f"measured:{kind}" and second.step == 1
    if kind == "llama-server":
        assert [a.state for a in second.agents] == ["decoding", "decoding", "idle"]
        a0, a1 = second.agents[0], second.agents[1]
        assert a0.context - 1800 - 40 == a1.context - 900 - 10 > 0  # cache + processed + decoded, in lockstep
        assert second.batch == 2 and second.kv_bytes == pytest.approx((a0.context + a1.context) * 147e3)
        assert second.tokens == 2 * a0.generated  # each slot's own n_decoded growth
        assert poller.header()["model"]["name"] == "Qwen3.5-9B-Q4_K_M.gguf"
    else:
        assert second.batch == 3 and len(second.agents) == 5
        est = 0.42 * VLLM_BLOCKS * VLLM_BLOCK_TOKENS / 3  # KV cache in use over the running requests
        assert second.mean_context == pytest.approx(est, abs=1) and "estimated" in second.note
        assert [a.context for a in second.agents] == [round(est)] * 3 + [0, 0]
        assert poller.header()["context_source"].startswith("estimated:")
    assert second.tokens > 0 and second.tokens_per_second > 0
    assert second.predicted_speedup == pytest.approx(predicted_speedup(second.batch, second.mean_context, 5.5e9, 147e3))
    assert first.tokens == 0  # the first poll has no previous counter to subtract


def test_parse_metrics_sums_label_sets():
    m = parse_metrics(VLLM_METRICS.format(gen=10.0, steps=5))
    assert m["vllm:num_requests_running"] == 3 and m["vllm:generation_tokens_total"] == 10


def test_vllm_context_estimate_says_why_when_it_cannot():
    text = VLLM_METRICS.format(gen=1.0, steps=1)
    assert estimate_vllm_context(parse_samples(text), 0).mean_tokens is None
    bare = "\n".join(ln for ln in text.splitlines() if "cache_config_info" not in ln)
    est = estimate_vllm_context(parse_samples(bare), 3)
    assert est.mean_tokens is None and "num_gpu_blocks" in est.why
    # a second engine (data parallel): one more usage gauge and one more cache, each under its own labels
    two = text + ('vllm:kv_cache_usage_perc{engine="1"} 0.22\n'
                  'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="2503"} 1.0\n')
    est = estimate_vllm_context(parse_samples(two), 4)
    assert est.mean_tokens == pytest.approx((0.42 + 0.22) / 2 * 2 * VLLM_BLOCKS * VLLM_BLOCK_TOKENS / 4)


async def test_foreign_attach_is_read_only(stand_in):
    kind, url = stand_in
    poller = (LlamaServerPoller if kind == "llama-server" else VllmPoller)(url, None, None)
    app = SwarmApp(ForeignSource(poller, interval_s=0.1))
    async with app.run_test(size=(120, 40)) as pilot:
        for _ in range(100):
            if app.stats.steps >= 3:
                break
            await pilot.pause(0.05)
        assert app.stats.steps >= 3 and app.mode == f"READ-ONLY {kind}"
        assert app.check_action("cycle_kv", ()) is None and app.check_action("cap", (1,)) is None
        n = app.engine_stopped
        assert app.stop_engine() and n.is_set()


def test_record_attach_to_llama_server(stand_in, tmp_path):
    kind, url = stand_in
    out = run_cli("record", "--attach", url, "--steps", "3", "--weight-bytes", "5.5e9", "--kv-bytes-per-token",
                  "147000", "-o", str(tmp_path / "r.jsonl"))
    assert out.returncode == 0, out.stderr
    lines = (tmp_path / "r.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["source"] == f"measured:{kind}" and len(lines) == 4


# The recorded llama-server ----------------------------------------------------------------------------

needs_fixture = pytest.mark.skipif(not fixture_server.FIXTURE.exists(), reason="no llama-server transcript")


def server_counts(lines: list[fixture_server.Line]) -> dict[float, tuple[int, int, bool]]:
    """Per recorded round after the first, computed apart from the poller: (tokens the slots' n_decoded
    grew by, a new task counting from 0; tokens the server decoded, by its own books: the task-end counter
    tokens_predicted_total plus the live tasks' n_decoded, which also counts a task's last tokens when it
    ends between polls; whether a task ended and another took its slot, its last tokens shown nowhere in
    /slots)."""
    slots = {ln.t: json.loads(ln.body) for ln in lines if ln.path == "/slots"}
    predicted = {ln.t: parse_metrics(ln.body)["llamacpp:tokens_predicted_total"] for ln in lines
                 if ln.path == "/metrics"}

    def live(s: dict) -> int:
        return s["next_token"][0]["n_decoded"] if s.get("is_processing") else 0

    out, prev = {}, None
    for t in sorted(slots):
        if prev is not None:
            grew, hidden = 0, False
            for a, b in zip(slots[prev], slots[t], strict=True):
                same = a.get("id_task") == b.get("id_task")
                hidden |= bool(a.get("is_processing") and not same)
                if b.get("is_processing"):
                    grew += live(b) - live(a) if same and a.get("is_processing") else live(b)
            books = predicted[t] + sum(map(live, slots[t])) - predicted[prev] - sum(map(live, slots[prev]))
            out[t] = (grew, int(books), hidden)
        prev = t
    return out


def replay_polls(metrics: bool, w: float | None = 2.0e8, k: float | None = 92e3):
    """Poll the replay once per recorded round, the replay clock standing in for the poller's."""
    replay = fixture_server.Replay(fixture_server.load(), metrics=metrics)
    replay.at(replay.rounds[0])
    with fixture_server.serve(replay) as url:
        assert detect(url) == "llama-server"
        poller = LlamaServerPoller(url, w, k, clock=lambda: replay.clock)
        recs = {}
        for t in replay.rounds:
            replay.at(t)
            recs[t] = poller.poll()
        header = poller.header()
        poller.close()
    return replay, recs, header


@needs_fixture
@pytest.mark.parametrize("metrics", [True, False], ids=["--metrics", "no-metrics"])
def test_replayed_llama_server_live_rate_matches_the_slots(metrics):
    """The bar: live tok/s > 0 on every poll where a slot decoded, within 5% of the slots' own decoded-token
    deltas; /metrics is not needed (it only recovers a task's last tokens when another task took its slot)."""
    replay, recs, header = replay_polls(metrics)
    counts = server_counts(replay.lines)
    rounds = replay.rounds
    assert recs[rounds[0]].tokens == 0 and header["model"]["name"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    decoded_polls = 0
    for prev, t in zip(rounds, rounds[1:], strict=False):
        r, (grew, books, hidden) = recs[t], counts[t]
        assert r.source == "measured:llama-server" and r.seconds == pytest.approx(t - prev)
        if grew == 0 and books == 0:
            assert r.tokens == 0
            continue
        decoded_polls += 1
        assert r.tokens_per_second > 0, t
        if metrics or not hidden:  # without /metrics, nothing shows the last tokens of a task whose slot was retaken
            assert r.tokens_per_second == pytest.approx(books / (t - prev), rel=0.05), t
        assert grew <= r.tokens <= books  # never below what the slots showed, never above the server's books
    assert decoded_polls >= 35
    total = sum(r.tokens for r in recs.values())
    final = parse_metrics([ln for ln in replay.lines if ln.path == "/metrics"][-1].body)
    # every task ended by the last round: the server's own count of the tokens it decoded
    assert total == pytest.approx(final["llamacpp:tokens_predicted_total"], rel=0.01 if metrics else 0.02)


@needs_fixture
def test_replayed_phases_speedups_and_per_slot_counts():
    w, k = 2.0e8, 92e3
    replay, recs, _ = replay_polls(metrics=False, w=w, k=k)
    by_t = dict(recs)
    first_prompt = by_t[1.509]  # one request arrived: its prompt is in flight, nothing decodes yet
    assert first_prompt.kind == "prefill" and first_prompt.agents[3].state == "prefilling"
    stalled = by_t[5.055]  # a 1,800-token prompt holds up the slot that was decoding
    assert [a.state for a in stalled.agents] == ["idle", "idle", "prefilling", "decoding"]
    assert stalled.tokens == 0 and "slot 2 (1,807 tokens)" in stalled.note
    assert "prompt processed: 1,818 tokens" in by_t[10.604].note  # its prompt, done: a phase of its own
    generated = {}
    for r in recs.values():
        for a in r.agents:  # a new task on a slot is a new origin, never a negative rate
            assert a.generated >= generated.get(a.id, 0)
            generated[a.id] = a.generated
        if r.kind == "decode" and r.batch:
            assert r.predicted_speedup == pytest.approx(predicted_speedup(r.batch, r.mean_context, w, k))
            assert r.kv_bytes == pytest.approx(sum(a.context for a in r.agents if a.id in r.batch_ids) * k)
    last = recs[replay.rounds[-1]]
    # idle slots keep their last task's cells: prompt + decoded - 1 (the last token is never fed back)
    assert [a.context for a in last.agents] == [355, 131, 2047, 306] and last.batch == 0
    # calibrated once steps were timed at two batch sizes (4 and 3 here): a model of this server's steps
    late = [r for r in recs.values() if r.batch and r.calibrated_speedup is not None]
    assert late and all(r.fit and r.fit["rms_error"] < 0.5 for r in late)
    four = next(r for r in recs.values() if r.batch == 4)
    assert by_t[11.106].calibrated_speedup is None and four.predicted_speedup > 1


def reading(task: int | None, decoded: int, processing: bool = True, prompt: int = 10, remain: int = -1,
            held: int = 0) -> SlotReading:
    return SlotReading(0, 2048, processing, task, prompt if processing else 0, prompt if processing else 0, 0,
                       decoded if processing else 0, remain, held)


def test_slot_counters_going_down_or_a_new_task_are_not_negative_rates():
    assert slot_delta(reading(5, 40), reading(5, 52)).decoded == 12
    assert slot_delta(reading(5, 40), reading(5, 3)).decoded == 3  # reset under the same id: counts from 0
    d = slot_delta(reading(5, 40, remain=7), reading(6, 4))
    assert d.decoded == 4 and d.hidden and d.hidden_seen == 40 and d.hidden_bound == 7
    # the task ended: the idle slot's cells (prompt + decoded - 1) tell its final count
    d = slot_delta(reading(5, 40, remain=20), reading(5, 0, processing=False, held=10 + 50 - 1))
    assert d.decoded == 10 and d.ended_final == 50
    d = slot_delta(reading(5, 40, remain=5), reading(5, 0, processing=False, held=10 + 50 - 1))
    assert d.decoded == 5  # never more than it had left
    assert slot_delta(reading(None, 0, processing=False), reading(None, 0, processing=False)).decoded == 0


@needs_fixture
def test_record_attached_to_the_replayed_server(tmp_path, model_path):
    """The CLI on its own timer (each poll of /slots moves the replay to the next recorded round), W and k
    read with --gguf from the very model the recorded server ran."""
    replay = fixture_server.Replay(fixture_server.load(), advance_on_slots=True)
    replay.at(11.106)  # four slots decoding
    with fixture_server.serve(replay) as url:
        out = run_cli("record", "--attach", url, "--steps", "4", "--gguf", str(model_path),
                      "-o", str(tmp_path / "r.jsonl"))
    assert out.returncode == 0, out.stderr
    lines = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()]
    header, steps = lines[0], lines[2:]
    assert header["source"] == "measured:llama-server" and len(lines) == 5
    w, k = header["weight_bytes"], header["kv_bytes_per_token"]["remote"]
    assert w > 0 and k > 0
    assert all(s["tokens"] > 0 and s["tokens_per_second"] > 0 and s["batch"] == 4 for s in steps)
    assert all(s["predicted_speedup"] == pytest.approx(predicted_speedup(4, s["mean_context"], w, k)) for s in steps)


@needs_fixture
def test_slots_disabled_is_a_clear_error(tmp_path):
    lines = [ln for ln in fixture_server.load() if ln.path != "/slots"]
    lines.append(fixture_server.Line(0.0, "/slots", 501, "application/json", json.dumps(
        {"error": {"code": 501, "message": "This server does not support slots endpoint.",
                   "type": "not_supported_error"}})))
    with fixture_server.serve(fixture_server.Replay(lines, clock=12.0)) as url:
        out = run_cli("record", "--attach", url, "--steps", "2", "-o", str(tmp_path / "r.jsonl"))
    assert out.returncode == 2 and "--no-slots" in out.stderr and "Traceback" not in out.stderr

"""Attach to engines people already run, read-only. Neither llama-server nor vLLM can run here, so
stand-ins serve their real endpoints, field names and metric names on a loopback port."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from engine.remote.foreign import LlamaServerPoller, VllmPoller, detect, parse_metrics
from engine.sources import ForeignSource
from tests.conftest import run_cli
from tui.app import SwarmApp

LLAMA_METRICS = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total {prompt}
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total {predicted}
# TYPE llamacpp:tokens_predicted_seconds_total counter
llamacpp:tokens_predicted_seconds_total 12.5
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total 900
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
"""


def slots(n_decoded: int):
    return [
        {"id": 0, "n_ctx": 4096, "is_processing": True, "id_task": 7, "n_prompt_tokens": 1800,
         "n_prompt_tokens_processed": 300, "n_prompt_tokens_cache": 1500,
         "next_token": [{"has_next_token": True, "has_new_line": False, "n_remain": -1, "n_decoded": n_decoded}],
         "params": {"temperature": 0.8}},
        {"id": 1, "n_ctx": 4096, "is_processing": True, "id_task": 8, "n_prompt_tokens": 900,
         "n_prompt_tokens_processed": 900, "n_prompt_tokens_cache": 0,
         "next_token": [{"has_next_token": True, "has_new_line": False, "n_remain": -1, "n_decoded": 10}]},
        {"id": 2, "n_ctx": 4096, "is_processing": False, "id_task": -1, "n_prompt_tokens": 0,
         "next_token": [{"has_next_token": False, "has_new_line": False, "n_remain": -1, "n_decoded": 0}]},
    ]


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
                return self._send(200, LLAMA_METRICS.format(prompt=5000, predicted=1000 + 20 * cls.polls),
                                  "text/plain; version=0.0.4")
        else:
            if p == "/metrics":
                return self._send(200, VLLM_METRICS.format(gen=2000.0 + 30 * cls.polls), "text/plain; version=0.0.4")
            if p == "/v1/models":
                return self._send(200, json.dumps({"data": [{"id": "Qwen/Qwen3-8B"}]}))
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
        assert second.agents[0].context == 1500 + 300 + second.agents[0].generated  # cache + processed + decoded
        assert second.batch == 2 and second.kv_bytes == pytest.approx(
            (second.agents[0].context + second.agents[1].context) * 147e3)
        assert poller.header()["model"]["name"] == "Qwen3.5-9B-Q4_K_M.gguf"
    else:
        assert second.batch == 3 and len(second.agents) == 5 and "42%" in second.note
    assert second.tokens > 0 and second.tokens_per_second > 0
    assert first.tokens == 0  # the first poll has no previous counter to subtract


def test_parse_metrics_sums_label_sets():
    m = parse_metrics(VLLM_METRICS.format(gen=10.0))
    assert m["vllm:num_requests_running"] == 3 and m["vllm:generation_tokens_total"] == 10


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

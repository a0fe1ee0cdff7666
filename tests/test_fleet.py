"""Two `swarmtune serve --clients` nodes behind the real SGLang Model Gateway (`sglang-router` from PyPI,
its cache-aware policy): it registers them, routes a conversation's turns to the node that holds its
cells, and every returning turn reports cached tokens there. A real Prometheus (the Debian package, which
.ci/run installs) scrapes the nodes and the router, and the figures are read back through its query API."""

import shutil
import socket
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import openai
import pytest

from tests.remote_helpers import served

pytestmark = pytest.mark.model

ROUTER_START_S = 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def fleet():
    with ExitStack() as stack:
        nodes = [stack.enter_context(served("--clients", "--agents", "3", "--ctx", "2048", "--threads", "1"))
                 for _ in range(2)]
        port, metrics_port = free_port(), free_port()
        router = subprocess.Popen(
            [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
             "--worker-urls", *(n.url for n in nodes), "--policy", "cache_aware", "--log-level", "warn",
             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
             "--worker-startup-timeout-secs", str(ROUTER_START_S), "--worker-startup-check-interval", "1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        stack.callback(lambda: (router.kill(), router.wait(10)))
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + ROUTER_START_S
        while True:  # ready once it has both workers
            try:
                workers = httpx.get(url + "/workers", timeout=2).json()
                if len(workers.get("workers", [])) == 2:
                    break
            except (httpx.HTTPError, ValueError):
                pass
            assert router.poll() is None and time.time() < deadline, "the router did not register both nodes"
            time.sleep(0.5)
        yield url, nodes, f"127.0.0.1:{metrics_port}"


def node_of(nodes, rid: str) -> str:
    (url,) = [n.url for n in nodes if httpx.get(f"{n.url}/v1/requests/{rid}", timeout=5).status_code == 200]
    return url


def test_a_node_answers_the_routers_probes(fleet):
    _, nodes, _ = fleet
    info = httpx.get(nodes[0].url + "/model_info", timeout=5).json()
    assert info["is_generation"] is True and info["served_model_name"].endswith(".gguf")
    server = httpx.get(nodes[0].url + "/get_server_info", timeout=5).json()
    assert server["max_running_requests"] == 3 and server["kv_cache_dtype"] == "f16"


def test_through_the_router_every_returning_turn_reuses_its_cells_on_one_node(fleet):
    url, nodes, _ = fleet
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", timeout=120)
    for conv in range(3):
        msgs = [{"role": "system", "content": f"You are coding agent {conv}. Work in small, tested steps."},
                {"role": "user", "content": f"Task {conv}: the parser drops the last field; find out why."}]
        served_by = set()
        for turn in range(3):
            r = client.chat.completions.create(model="m", messages=msgs, max_tokens=8)
            served_by.add(node_of(nodes, r.id))
            cached = r.usage.prompt_tokens_details.cached_tokens
            print(f"conversation {conv} turn {turn}: {r.usage.prompt_tokens} prompt, {cached} cached")
            if turn:
                assert cached > 0, "a returning turn reached a node without its cells"
            msgs += [{"role": "assistant", "content": r.choices[0].message.content},
                     {"role": "user", "content": f"Tool output {turn}: 3 tests failed in test_parser.py."}]
        assert len(served_by) == 1, f"conversation {conv} was served by {served_by}"


SCRAPE_S = 1


@pytest.fixture(scope="module")
def prometheus(fleet, tmp_path_factory):
    binary = shutil.which("prometheus")
    assert binary, "Prometheus is not installed: apt-get install prometheus (.ci/run does)"
    _, nodes, router_metrics = fleet
    d: Path = tmp_path_factory.mktemp("prometheus")
    nodes_at = ", ".join(f"'{n.url.removeprefix('http://')}'" for n in nodes)
    (d / "prometheus.yml").write_text(
        f"global: {{scrape_interval: {SCRAPE_S}s, scrape_timeout: {SCRAPE_S}s}}\n"
        f"scrape_configs:\n"
        f"  - {{job_name: swarmtune, static_configs: [{{targets: [{nodes_at}]}}]}}\n"
        f"  - {{job_name: router, static_configs: [{{targets: ['{router_metrics}']}}]}}\n")
    port = free_port()
    proc = subprocess.Popen([binary, f"--config.file={d / 'prometheus.yml'}", f"--storage.tsdb.path={d / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 30
        while True:
            try:
                if httpx.get(url + "/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.time() < deadline, "Prometheus did not get ready"
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        proc.wait(20)


def query(prom: str, q: str) -> list[dict]:
    r = httpx.get(prom + "/api/v1/query", params={"query": q}, timeout=5).json()
    assert r["status"] == "success", r
    return r["data"]["result"]


def test_prometheus_scrapes_every_node_and_the_router_and_reads_the_figures_back(fleet, prometheus):
    _, nodes, _ = fleet
    deadline = time.time() + 60
    while time.time() < deadline:  # every target up, and the nodes' served traffic scraped since
        up = {(r["metric"]["job"], r["metric"]["instance"]): r["value"][1] for r in query(prometheus, "up")}
        hits = query(prometheus, "vllm:prefix_cache_hits_total")
        if len(up) == 3 and set(up.values()) == {"1"} and sum(float(r["value"][1]) for r in hits) > 0:
            break
        time.sleep(SCRAPE_S)
    else:
        raise AssertionError(f"targets {up}, prefix-cache hits {hits}")
    instances = {n.url.removeprefix("http://") for n in nodes}
    # swarmtune's own figures and their vLLM mirror, each series labelled with its node
    for q in ("swarmtune_kv_setting", "swarmtune_tokens_per_second", "vllm:num_requests_running",
              "swarmtune_prefix_cache_hits_total", "vllm:prompt_tokens_total"):
        assert {r["metric"]["instance"] for r in query(prometheus, q)} == instances, q
    (kv,) = {r["metric"]["kv"] for r in query(prometheus, "swarmtune_kv_setting")}
    assert kv == "f16"
    total = query(prometheus, "sum(vllm:prefix_cache_hits_total) / sum(vllm:prefix_cache_queries_total)")
    assert 0 < float(total[0]["value"][1]) < 1  # the fleet's hit rate, as a dashboard computes it

"""Two `swarmtune serve --clients` nodes behind the real SGLang Model Gateway (`sglang-router` from PyPI,
its cache-aware policy): it registers them, routes a conversation's turns to the node that holds its
cells, and every returning turn reports cached tokens there. A real Prometheus (the Debian package, which
.ci/run installs) scrapes the nodes and the router, and the figures are read back through its query API."""

import random
import re
import signal
import string
import subprocess
import sys
import time
from contextlib import ExitStack

import httpx
import openai
import pytest

from tests.conftest import until
from tests.remote_helpers import free_port, prometheus_server, served, start_server

pytestmark = [pytest.mark.model, pytest.mark.xdist_group("fleet")]  # the kill test comes last, on the same nodes

ROUTER_START_S = 60
NODE_ARGS = ("--clients", "--agents", "3", "--ctx", "2048", "--threads", "1")
# docs/fleet.md's router flags: a worker's circuit opens after 2 failures, so that the router's own retry
# of a request sent to a dead node lands on a live one; it closes again 5 s after the node is back
ROUTER_FAILOVER = ("--cb-failure-threshold", "2", "--cb-timeout-duration-secs", "5")


@pytest.fixture(scope="module")
def fleet():
    with ExitStack() as stack:
        nodes = [stack.enter_context(served(*NODE_ARGS)) for _ in range(2)]
        port, metrics_port = free_port(), free_port()
        router = subprocess.Popen(
            [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
             "--worker-urls", *(n.url for n in nodes), "--policy", "cache_aware", "--log-level", "warn",
             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
             "--worker-startup-timeout-secs", str(ROUTER_START_S), "--worker-startup-check-interval", "1",
             *ROUTER_FAILOVER],
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
def prometheus(fleet):
    _, nodes, router_metrics = fleet
    with prometheus_server({"swarmtune": [n.url for n in nodes], "router": [router_metrics]}, SCRAPE_S) as url:
        yield url


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


def running_on(node) -> float:
    m = re.search(r"^swarmtune_requests_running (\S+)$", httpx.get(node.url + "/metrics", timeout=5).text, re.M)
    assert m, "the node exports no swarmtune_requests_running"
    return float(m.group(1))


def test_a_node_killed_mid_stream_fails_its_stream_and_its_conversation_moves_on(fleet, prometheus):
    url, nodes, _ = fleet
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", timeout=60, max_retries=0)  # the router's retry alone
    msgs = [{"role": "system", "content": "You are coding agent K. Keep going until the work is done."},
            {"role": "user", "content": "Write out, at length, every step of porting the parser to Rust."}]
    r = client.chat.completions.create(model="m", messages=msgs, max_tokens=8)
    (home,) = [n for n in nodes if n.url == node_of(nodes, r.id)]
    (other,) = [n for n in nodes if n is not home]
    msgs += [{"role": "assistant", "content": r.choices[0].message.content},
             {"role": "user", "content": "Go on, all of it."}]
    stream = client.chat.completions.create(model="m", messages=msgs, max_tokens=400, stream=True,
                                            extra_body={"ignore_eos": True})
    chunks = iter(stream)
    # the first chunk (the role) goes out before an agent takes the request: wait for generated text
    while not (c := next(chunks)).choices or not c.choices[0].delta.content:
        pass
    assert running_on(home) == 1 and running_on(other) == 0
    port = int(home.url.rsplit(":", 1)[1])
    home.stop(signal.SIGKILL)
    killed = time.time()
    with pytest.raises(openai.APIConnectionError):  # an error the SDK raises, not a hang
        for _ in chunks:
            pass
    print(f"the stream raised {time.time() - killed:.2f} s after the kill")
    assert time.time() - killed < 10

    # the conversation's next turn: the router retries it onto the live node, one node at a time
    r = client.chat.completions.create(model="m", messages=msgs, max_tokens=8)
    assert node_of([other], r.id) == other.url
    msgs += [{"role": "assistant", "content": r.choices[0].message.content},
             {"role": "user", "content": "Now the tests."}]

    # Prometheus marks the node down at its next scrape
    instance = home.url.removeprefix("http://")
    assert until(lambda: [x["value"][1] for x in query(prometheus, f'up{{instance="{instance}"}}')] == ["0"],
                 timeout=4 * SCRAPE_S), "Prometheus did not mark the killed node down"
    down_at = float(query(prometheus, f'timestamp(up{{instance="{instance}"}})')[0]["value"][1])
    print(f"marked down by the scrape {down_at - killed:.2f} s after the kill (every {SCRAPE_S} s)")
    assert down_at - killed <= 2 * SCRAPE_S

    back = start_server(*NODE_ARGS, port=port)  # restarted where it was: it rejoins, the other untouched
    try:
        live = [back, other]
        rng = random.Random(7)
        deadline = time.time() + 60
        while True:  # new conversations, unlike any before, until the router sends one to the restarted node
            words = " ".join("".join(rng.choices(string.ascii_lowercase, k=6)) for _ in range(40))
            r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": words}],
                                               max_tokens=2)
            if node_of(live, r.id) == back.url:
                break
            assert time.time() < deadline, "the restarted node never got a conversation through the router"
            time.sleep(1)
        assert other.proc.poll() is None
        # the moved conversation goes on, on one node: the router may send it back to the restarted node
        # (it did, with sglang-router 0.3.2), which then prefills it as new
        r = client.chat.completions.create(model="m", messages=msgs, max_tokens=8)
        where = "the restarted" if node_of(live, r.id) == back.url else "the same"
        print(f"after the rejoin, the moved conversation went to {where} node "
              f"({r.usage.prompt_tokens_details.cached_tokens} of {r.usage.prompt_tokens} cached)")
    finally:
        back.stop(signal.SIGKILL)

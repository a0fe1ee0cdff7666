"""The fleet dashboard (`swarmtune fleet`) on two simulated `swarmtune serve` nodes, one behind a token, as the
real Prometheus that scrapes them sees them: a row per node with its setting and figures and the fleet's
totals; a control sent to one node or to all, through each node's own /v1/control with its token; a refusal
shown against its node; a node killed with kill -9 marked down within two scrapes, and back once restarted."""

import asyncio
import json
import signal
import time
from contextlib import ExitStack

import httpx
import pytest
from rich.text import Text
from textual.widgets import DataTable

from swarmtune.sources.fleet import PrometheusFleet, nodes_from, totals
from swarmtune.tui.fleet_app import ALL, FleetApp
from tests.conftest import SIM, run_cli, until, wait_for
from tests.remote_helpers import prometheus_server, served, start_server

pytestmark = pytest.mark.xdist_group("fleet_view")  # the kill test comes last, on the same nodes

SCRAPE_S = 1.0
TOKEN = "fleet-secret"
NODE_ARGS = ("--sim", SIM, "--agents", "4")


def at(node) -> str:
    return node.url.removeprefix("http://")


@pytest.fixture(scope="module")
def sim_fleet():
    with ExitStack() as stack:
        a = stack.enter_context(served(*NODE_ARGS))
        b = stack.enter_context(served(*NODE_ARGS, "--token", TOKEN))
        prom = stack.enter_context(prometheus_server({"swarmtune": [a.url, b.url]}, SCRAPE_S))
        fleet = PrometheusFleet(prom)
        stack.callback(fleet.close)
        assert until(lambda: all(n.up and n.tokens_per_second for n in fleet.read().nodes) and
                     len(fleet.read().nodes) == 2, timeout=60), fleet.read()
        yield prom, a, b


def test_the_fleet_reads_every_node_and_its_totals_from_prometheus(sim_fleet):
    prom, a, b = sim_fleet
    fleet = PrometheusFleet(prom)
    snap = fleet.read()
    fleet.close()
    assert [n.instance for n in snap.nodes] == sorted([at(a), at(b)])
    for n in snap.nodes:
        assert n.up and n.job == "swarmtune" and n.kv == "f16" and n.agents == 4 and n.batch_cap is not None
        assert n.scraped_s_ago is not None and n.scraped_s_ago < 3 * SCRAPE_S
    t = snap.totals
    assert (t.nodes, t.nodes_up, t.agents) == (2, 2, 8)
    assert t.tokens_per_second == pytest.approx(sum(n.tokens_per_second or 0 for n in snap.nodes))
    out = run_cli("fleet", prom, "--json", timeout=60)  # the same snapshot, headless
    assert out.returncode == 0, out.stderr
    assert {n["instance"] for n in json.loads(out.stdout)["nodes"]} == {at(a), at(b)}


def test_the_fleet_command_refuses_a_prometheus_that_is_not_there(sim_fleet):
    out = run_cli("fleet", "http://127.0.0.1:9", "--json", timeout=60)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "did not answer" in out.stderr, out.stderr
    _, a, _ = sim_fleet
    out = run_cli("fleet", a.url, "--json", timeout=60)  # a node, not its Prometheus
    assert out.returncode == 2 and "is not a Prometheus query API (HTTP 404)" in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1


def series(name: str, instance: str, job: str, value: float, **labels: str) -> dict:
    return {"metric": {"__name__": name, "instance": instance, "job": job, **labels}, "value": [100.0, str(value)]}


def test_a_down_node_keeps_its_row_and_a_router_is_not_a_node():
    """Prometheus's own shapes, as the three queries return them: a node whose scrape failed has `up 0` and
    no other series (staleness), the router's job exports none of swarmtune's."""
    now = [series("up", "a:1", "swarmtune", 0), series("up", "b:1", "swarmtune", 1), series("up", "r:1", "router", 1),
           series("swarmtune_kv_setting", "b:1", "swarmtune", 1, kv="q8_0/f16"),
           series("swarmtune_tokens_per_second", "b:1", "swarmtune", 12.5, source="measured"),
           series("swarmtune_agents", "b:1", "swarmtune", 4), series("swarmtune_watts", "b:1", "swarmtune", 50),
           series("swarmtune_prefix_cache_hits_total", "b:1", "swarmtune", 30),
           series("swarmtune_prefix_cache_queries_total", "b:1", "swarmtune", 120)]
    last_kv = [{"metric": {"instance": "a:1", "job": "swarmtune", "kv": "f16"}, "value": [100.0, "1"]}]
    scraped = [{"metric": {"instance": i, "job": j}, "value": [99.0, "99.5"]}
               for i, j in (("a:1", "swarmtune"), ("b:1", "swarmtune"), ("r:1", "router"))]
    a, b = nodes_from(now, last_kv, scraped, 100.0)
    assert (a.instance, a.up, a.kv, a.tokens_per_second, a.scraped_s_ago) == ("a:1", False, "f16", None, 0.5)
    assert (b.up, b.kv, b.agents, b.hit_rate) == (True, "q8_0/f16", 4, 0.25)
    t = totals((a, b))
    assert (t.nodes, t.nodes_up, t.agents, t.tokens_per_second, t.hit_rate) == (2, 1, 4, 12.5, 0.25)
    assert (t.watts, t.joules_per_token, t.powered) == (50, 4.0, 1)


def row_text(table: DataTable, key: str) -> str:
    """The row as the terminal shows it: its cells' text without their markup."""
    return " ".join(Text.from_markup(str(c)).plain for c in table.get_row(key))


async def command(pilot, text: str) -> None:
    keys = ["space" if c == " " else c for c in text]
    await pilot.press("colon", *keys, "enter")


async def test_a_control_goes_to_one_node_or_to_all_with_each_nodes_token(sim_fleet):
    prom, a, b = sim_fleet
    app = FleetApp(PrometheusFleet(prom), 0.5, {at(b): TOKEN}, None)
    async with app.run_test(size=(220, 20)) as pilot:
        assert await wait_for(pilot, lambda: app.snapshot is not None and app.snapshot.totals.nodes_up == 2)
        table = app.query_one("#nodes", DataTable)
        table.move_cursor(row=table.get_row_index(ALL))  # the fleet row: every node
        await command(pilot, "cap 2")
        assert await wait_for(pilot, lambda: len(app.answers) == 2, timeout=30), app.answers
        assert all(x.ok for x in app.answers.values()), app.answers
        for node, token in ((a, None), (b, TOKEN)):
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            assert httpx.get(node.url + "/v1/state", headers=headers, timeout=5).json()["settings"]["batch_cap"] == 2
        # and the nodes' new setting comes back through Prometheus, as every figure on the screen does
        assert await wait_for(pilot, lambda: all(n.batch_cap == 2 for n in app.snapshot.nodes), timeout=15)

        table.move_cursor(row=table.get_row_index(at(b)))  # one node: a refusal shows against it alone
        await command(pilot, "agents 999")
        assert await wait_for(pilot, lambda: not app.answers[at(b)].ok, timeout=30)
        assert "agents must be between 1 and" in app.answers[at(b)].line
        assert app.answers[at(a)].ok  # untouched: its answer to the last control it was sent
        assert "agents must be between 1 and" in row_text(table, at(b))

        app.tokens = {}  # without b's token: a applies, b refuses, each said against its node
        await command(pilot, "all cap 3")
        assert await wait_for(pilot, lambda: app.answers[at(b)].line.startswith("wants a token"), timeout=30)
        assert app.answers[at(a)].ok and "cap 3" in app.answers[at(a)].line
        assert "wants a token" in row_text(table, at(b))

        await command(pilot, "cap many")  # a bad command reaches no node
        await pilot.pause(0.3)
        assert app.answers[at(a)].line.startswith("kv f16, cap 3")


async def test_a_node_killed_is_marked_down_within_two_scrapes_and_rejoins(sim_fleet):
    prom, a, b = sim_fleet
    app = FleetApp(PrometheusFleet(prom), 0.2, {}, None)
    async with app.run_test(size=(220, 20)) as pilot:
        assert await wait_for(pilot, lambda: app.snapshot is not None and app.snapshot.totals.nodes_up == 2)
        table = app.query_one("#nodes", DataTable)
        port = int(a.url.rsplit(":", 1)[1])
        a.stop(signal.SIGKILL)
        killed = time.time()
        assert await wait_for(pilot, lambda: "DOWN" in row_text(table, at(a)), timeout=10 * SCRAPE_S)
        seen_s = time.time() - killed
        print(f"a node killed was marked down {seen_s:.2f} s later (scrape interval {SCRAPE_S} s)")
        assert seen_s <= 2 * SCRAPE_S + 1.0  # two scrapes, and one read of Prometheus
        down = {n.instance: n for n in app.snapshot.nodes}
        assert down[at(a)].kv == "f16" and down[at(b)].up  # kept, with what it last ran; the other untouched
        assert app.snapshot.totals.nodes_up == 1 and "1/2 up" in row_text(table, ALL)

        back = await asyncio.to_thread(start_server, *NODE_ARGS, port=port)
        try:
            assert await wait_for(pilot, lambda: row_text(table, at(a)).split()[1] == "up", timeout=30)
            assert app.snapshot.totals.nodes_up == 2
        finally:
            back.stop(signal.SIGKILL)

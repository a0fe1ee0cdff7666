"""A fleet of swarmtune nodes as the Prometheus server that scrapes them sees it: each node's setting and
figures, whether its last scrape answered, and the fleet's totals. swarmtune keeps no metrics store of its
own; this reads Prometheus's HTTP query API (`/api/v1/query`), as Grafana does.

A node is an `instance` that has exported swarmtune's series in the last hour, or any target of a scrape job
that holds one: a node that stops answering keeps its row, marked down at the first scrape that fails (its
`up` goes to 0 there), with the setting it last exported."""

import time
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any

import httpx

from swarmtune.engine.errors import UserError

# swarmtune's own series the view reads (swarmtune/server/metrics.py), each a gauge or counter per node
FIGURES = ("kv_setting", "batch_cap", "agents", "tokens_per_second", "mean_context_tokens", "kv_cache_usage_ratio",
           "watts", "joules_per_token", "tuner_on", "requests_running", "requests_waiting",
           "prefix_cache_hits_total", "prefix_cache_queries_total")
NOW_QUERY = '{__name__=~"up|swarmtune_(' + "|".join(FIGURES) + ')"}'
# staleness hides a down node's series from an instant query: its last known setting, from the last hour
LAST_KV_QUERY = "last_over_time(swarmtune_kv_setting[1h])"
SCRAPED_AT_QUERY = "timestamp(up)"
QUERY_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class NodeFigures:
    instance: str  # host:port, as Prometheus scrapes it; its API is there too
    job: str
    up: bool
    scraped_s_ago: float | None  # since its last scrape, answered or not
    down_s: float | None  # while down: since this view first saw it down
    kv: str | None  # last known, also while down
    batch_cap: int | None = None
    agents: int | None = None
    mean_context_tokens: float | None = None
    kv_usage: float | None = None  # cells held over the KV budget
    tokens_per_second: float | None = None
    watts: float | None = None
    joules_per_token: float | None = None
    tuner_on: bool | None = None
    running: int | None = None
    waiting: int | None = None
    prefix_hit_tokens: float | None = None  # since the node started
    prefix_query_tokens: float | None = None

    @property
    def hit_rate(self) -> float | None:
        if not self.prefix_query_tokens or self.prefix_hit_tokens is None:
            return None
        return self.prefix_hit_tokens / self.prefix_query_tokens


@dataclass(frozen=True)
class FleetTotals:
    nodes: int
    nodes_up: int
    agents: int
    tokens_per_second: float
    hit_rate: float | None  # over every up node's prompt tokens, as `sum(hits) / sum(queries)`
    watts: float | None  # over the up nodes that report power (`powered` of them)
    joules_per_token: float | None  # those nodes' watts over their tok/s
    powered: int


@dataclass(frozen=True)
class FleetSnapshot:
    nodes: tuple[NodeFigures, ...]
    totals: FleetTotals
    taken_at_s: float  # wall clock


def totals(nodes: tuple[NodeFigures, ...]) -> FleetTotals:
    up = [n for n in nodes if n.up]
    hits = sum(n.prefix_hit_tokens or 0.0 for n in up)
    queries = sum(n.prefix_query_tokens or 0.0 for n in up)
    powered = [n for n in up if n.watts is not None and n.tokens_per_second is not None]
    watts = sum(n.watts or 0.0 for n in powered)
    tps = sum(n.tokens_per_second or 0.0 for n in powered)
    return FleetTotals(
        nodes=len(nodes), nodes_up=len(up), agents=sum(n.agents or 0 for n in up),
        tokens_per_second=sum(n.tokens_per_second or 0.0 for n in up),
        hit_rate=hits / queries if queries else None, watts=watts if powered else None,
        joules_per_token=watts / tps if powered and tps > 0 else None, powered=len(powered))


class PrometheusFleet:
    """Reads the fleet from a Prometheus server, one snapshot per `read()` (three instant queries)."""

    def __init__(self, url: str, timeout_s: float = QUERY_TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        if not self.url.startswith(("http://", "https://")):
            self.url = "http://" + self.url
        try:
            self.http = httpx.Client(base_url=self.url, timeout=timeout_s)
        except httpx.InvalidURL as e:
            raise UserError(f"{url!r} is not a URL ({e})") from None
        # each node's setting as this view last saw it live: after a switch, the last hour holds two
        self.kv_seen: dict[str, str] = {}
        self.down_since: dict[str, float] = {}  # wall clock of the first read that found each node down

    def query(self, expr: str) -> list[dict[str, Any]]:
        try:
            r = self.http.get("/api/v1/query", params={"query": expr})
        except httpx.HTTPError as e:
            raise UserError(f"Prometheus at {self.url} did not answer ({type(e).__name__})") from None
        try:
            body = r.json()
        except ValueError:
            raise UserError(f"{self.url} is not a Prometheus query API (HTTP {r.status_code})") from None
        if not isinstance(body, dict) or "status" not in body:
            raise UserError(f"{self.url} is not a Prometheus query API (HTTP {r.status_code})")
        if body["status"] != "success":
            raise UserError(f"Prometheus refused {expr!r}: {body.get('error') or f'HTTP {r.status_code}'}")
        data = body.get("data")
        result = data.get("result") if isinstance(data, dict) else None
        if not isinstance(result, list) or not all(isinstance(x, dict) for x in result):
            raise UserError(f"{self.url} answered {expr!r} in a shape that is not Prometheus's instant vector")
        return result

    def read(self) -> FleetSnapshot:
        now = self.query(NOW_QUERY)
        last_kv = self.query(LAST_KV_QUERY)
        scraped_at = self.query(SCRAPED_AT_QUERY)
        taken = time.time()
        try:
            nodes = nodes_from(now, last_kv, scraped_at, taken)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError):
            raise UserError(f"{self.url} answered with series that are not Prometheus's instant vector") from None
        self.kv_seen.update({n.instance: n.kv for n in nodes if n.up and n.kv})
        for n in nodes:
            if n.up:
                self.down_since.pop(n.instance, None)
            else:
                self.down_since.setdefault(n.instance, taken)
        nodes = tuple(n if n.up else replace(n, kv=self.kv_seen.get(n.instance, n.kv),
                                             down_s=taken - self.down_since[n.instance]) for n in nodes)
        return FleetSnapshot(nodes, totals(nodes), taken)

    def close(self) -> None:
        self.http.close()


def nodes_from(now: list[dict[str, Any]], last_kv: list[dict[str, Any]], scraped_at: list[dict[str, Any]],
               at_s: float) -> tuple[NodeFigures, ...]:
    """The nodes from the three queries' results (Prometheus's vector form: {metric: labels, value: [t, "v"]})."""
    figures: dict[str, dict[str, float]] = defaultdict(dict)
    kv_now: dict[str, str] = {}
    up: dict[str, tuple[str, bool]] = {}
    swarm_jobs: set[str] = set()
    for s in now:
        m, v = s["metric"], float(s["value"][1])
        inst, job, name = m.get("instance", ""), m.get("job", ""), m.get("__name__", "")
        if name == "up":
            up[inst] = (job, v == 1.0)
            continue
        swarm_jobs.add(job)
        key = name.removeprefix("swarmtune_")
        if key == "kv_setting":
            kv_now[inst] = m.get("kv", "?")
        else:
            figures[inst][key] = figures[inst].get(key, 0.0) + v  # several label sets (a `source`) add up
    kv_known: dict[str, str] = {}
    jobs_of: dict[str, str] = {}
    for s in last_kv:
        inst = s["metric"].get("instance", "")
        kv_known[inst] = s["metric"].get("kv", "?")
        jobs_of[inst] = s["metric"].get("job", "")
        swarm_jobs.add(jobs_of[inst])
    ago = {s["metric"].get("instance", ""): at_s - float(s["value"][1]) for s in scraped_at}
    instances = set(kv_known) | set(figures) | set(kv_now) | {i for i, (job, _) in up.items() if job in swarm_jobs}
    out = []
    for inst in sorted(instances):
        job, alive = up.get(inst, (jobs_of.get(inst, ""), False))
        f = figures.get(inst, {}) if alive else {}
        num = f.get
        whole = {k: round(v) for k, v in f.items()}.get
        tuner = f.get("tuner_on")
        out.append(NodeFigures(
            instance=inst, job=job, up=alive, scraped_s_ago=ago.get(inst), down_s=None,
            kv=kv_now.get(inst) or kv_known.get(inst),
            batch_cap=whole("batch_cap"), agents=whole("agents"), mean_context_tokens=num("mean_context_tokens"),
            kv_usage=num("kv_cache_usage_ratio"), tokens_per_second=num("tokens_per_second"), watts=num("watts"),
            joules_per_token=num("joules_per_token"), tuner_on=None if tuner is None else tuner == 1.0,
            running=whole("requests_running"), waiting=whole("requests_waiting"),
            prefix_hit_tokens=num("prefix_cache_hits_total"), prefix_query_tokens=num("prefix_cache_queries_total")))
    return tuple(out)

"""Prometheus exposition: fresh metric families from the latest step at each scrape."""

from collections.abc import Iterator

from prometheus_client import Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from swarmtune.engine.agents.served import ServedAgents
from swarmtune.engine.agents.served_request import ServedRequest
from swarmtune.engine.record.records import RequestRecord
from swarmtune.server.runner import EngineRunner
from swarmtune.server.spec_metrics import spec_counters
from swarmtune.server.vllm_metrics import mirror_vllm


class EngineCollector(Collector):
    def __init__(self, runner: EngineRunner) -> None:
        self.runner = runner

    def collect(self) -> Iterator[Metric]:
        run = self.runner
        r = run.latest_decode
        src = run.header.get("source", "") if run.header else ""

        def gauge(name: str, doc: str, value: float | None) -> Iterator[GaugeMetricFamily]:
            if value is not None:
                g = GaugeMetricFamily(name, doc, labels=["source"])
                g.add_metric([src], float(value))
                yield g

        yield from gauge("swarmtune_tokens_per_second", "decode tokens per second, rolling 5 s",
                         run.rolling.tokens_per_second)
        yield from gauge("swarmtune_paused", "1 while the engine is paused", 1.0 if run.paused else 0.0)
        st = run.engine.state()
        yield from gauge("swarmtune_tuner_on", "1 while the tuner holds the settings", 1.0 if st.autotune else 0.0)
        kv = GaugeMetricFamily("swarmtune_kv_setting", "the KV setting in force (1), by its name (K/V apart as "
                               "q8_0/f16)", labels=["kv"])
        kv.add_metric([st.kv_label], 1.0)
        yield kv
        # the settings in force, also before the first step (a fleet view reads them from a node that idles)
        yield from gauge("swarmtune_batch_cap", "agents allowed per decode step", st.batch_cap)
        yield from gauge("swarmtune_agents", "agents in the swarm", st.agents)
        steps = CounterMetricFamily("swarmtune_steps", "engine steps since start", labels=["source"])
        steps.add_metric([src], run.rolling.steps_total)
        yield steps
        gen = CounterMetricFamily("swarmtune_generated_tokens", "decode tokens since start", labels=["source"])
        gen.add_metric([src], run.rolling.tokens_total)
        yield gen
        yield from spec_counters(run, "swarmtune_spec_", [], [])
        yield from _quality(run)
        if r is None:
            return
        yield from gauge("swarmtune_batch_size", "agents in the last step", r.batch)
        yield from gauge("swarmtune_weight_bytes_per_step", "weight bytes the last step read (shared)",
                         r.weight_bytes)
        yield from gauge("swarmtune_kv_bytes_per_step", "KV bytes the last step read (private; windowed layers "
                         "at most their window)", r.kv_bytes)
        yield from gauge("swarmtune_state_bytes_per_step", "recurrent state bytes the last step read (private)",
                         r.state_bytes)
        if r.distinct_experts is not None:
            g = GaugeMetricFamily("swarmtune_distinct_experts", "MoE: distinct experts per MoE layer the last step "
                                  "routed to", labels=["source"])
            g.add_metric([r.distinct_experts_source or "modeled"], r.distinct_experts)
            yield g
        yield from gauge("swarmtune_mean_context_tokens", "the last batch's mean context", r.mean_context)
        used = sum(a.context for a in r.agents if a.residency == "cache" and a.state != "preempted")
        budget = run.engine.budget_tokens(r.kv)
        yield from gauge("swarmtune_kv_cache_usage_ratio", "KV cells held by agents' histories over the KV budget "
                         "(0-1)", used / budget if budget else None)
        yield from gauge("swarmtune_predicted_speedup_ratio", "bytes model speedup B(W(1)+s+K(L))/(W(B)+B(s+K(L))) "
                         "(modeled)", r.predicted_speedup)
        yield from gauge("swarmtune_calibrated_speedup_ratio", "calibrated speedup (modeled)", r.calibrated_speedup)
        yield from gauge("swarmtune_measured_speedup_ratio", "speedup against the batch-1 reference",
                         r.measured_speedup)
        if r.watts is not None:
            g = GaugeMetricFamily("swarmtune_watts", "power over the last step", labels=["power_source"])
            g.add_metric([r.power_source or ""], r.watts)
            yield g
        if r.joules_per_token is not None:
            g = GaugeMetricFamily("swarmtune_joules_per_token", "energy per token of the last step",
                                  labels=["power_source"])
            g.add_metric([r.power_source or ""], r.joules_per_token)
            yield g


def _quality(run: EngineRunner) -> Iterator[GaugeMetricFamily]:
    """The live KV quality check's figures (engine/quality/quality_check.py), per setting and context band."""
    ledger = getattr(run.engine.quality, "ledger", None)
    if ledger is None:
        return
    kl = GaugeMetricFamily("swarmtune_kv_quality_kl_nats", "mean KL divergence of the next-token distribution "
                           "against f16/f16, per KV setting and context band (measured live)", labels=["kv", "band"])
    p99 = GaugeMetricFamily("swarmtune_kv_quality_kl_p99_nats", "its 99th percentile", labels=["kv", "band"])
    top = GaugeMetricFamily("swarmtune_kv_quality_top1_same_ratio", "share of positions whose top token is "
                            "f16/f16's", labels=["kv", "band"])
    for f in list(ledger.figures.values()):  # a copy: the engine's thread adds to it
        if f.mean_kl is None or f.p99_kl is None or f.top1_same is None:
            continue
        labels = [f.setting.label, f"{f.band[0]}-{f.band[1]}"]
        kl.add_metric(labels, f.mean_kl)
        p99.add_metric(labels, f.p99_kl)
        top.add_metric(labels, f.top1_same)
    yield from (kl, p99, top)


class ServedCollector(Collector):
    """Gauges of the served agents' queue, read at each scrape."""

    def __init__(self, served: ServedAgents) -> None:
        self.served = served

    def collect(self) -> Iterator[Metric]:
        for name, doc, value in (
                ("swarmtune_requests_running", "requests an agent is serving", self.served.busy_agents),
                ("swarmtune_requests_waiting", "requests queued for an agent", self.served.queued)):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], float(value))
            yield g


# vLLM's buckets, so that the dashboards people chart for vLLM read these as they read its own
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                  40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                 80.0)
REQUEST_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                     480.0, 960.0, 1920.0, 7680.0)

JOULE_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0)


def observe_requests(reg: CollectorRegistry, served: ServedAgents) -> None:
    """Request-level histograms, observed as each served request ends (on the engine's thread)."""
    ttft = Histogram("swarmtune_time_to_first_token_seconds", "arrival to the first token", registry=reg,
                     buckets=TTFT_BUCKETS_S)
    itl = Histogram("swarmtune_inter_token_latency_seconds", "between a request's tokens", registry=reg,
                    buckets=ITL_BUCKETS_S)
    queue = Histogram("swarmtune_request_queue_time_seconds", "arrival to an agent taking it", registry=reg,
                      buckets=REQUEST_BUCKETS_S)
    e2e = Histogram("swarmtune_e2e_request_latency_seconds", "arrival to the last token", registry=reg,
                    buckets=REQUEST_BUCKETS_S)
    prefill_time = Histogram("swarmtune_request_prefill_time_seconds", "an agent taking it to its first token",
                             registry=reg, buckets=REQUEST_BUCKETS_S)
    done = Counter("swarmtune_requests", "served requests that ended", ["finish_reason"], registry=reg)
    prompt = Counter("swarmtune_prompt_tokens", "prompt tokens of served requests", registry=reg)
    cached = Counter("swarmtune_prompt_tokens_cached", "prompt tokens whose cells were reused", registry=reg)
    generated = Counter("swarmtune_completion_tokens", "tokens generated for served requests", registry=reg)
    # vLLM's names (vllm:prefix_cache_queries, vllm:prefix_cache_hits: tokens), with this server's prefix
    queries = Counter("swarmtune_prefix_cache_queries", "prompt tokens looked up in the cache", registry=reg)
    hits = Counter("swarmtune_prefix_cache_hits", "prompt tokens whose cells were reused", registry=reg)
    copied = Counter("swarmtune_prefix_cache_copied_tokens", "of the hits, tokens copied from another agent's cells",
                     registry=reg)
    shifted = Counter("swarmtune_prefix_cache_shifted_tokens", "of the hits, old cells kept past a divergence and "
                      "shifted into place (--cache-reuse)", registry=reg)
    misses = Counter("swarmtune_cache_misses", "requests that prefilled what their conversation had held, or were "
                     "new, by cause (docs/serving.md)", ["cause"], registry=reg)
    energy = Histogram("swarmtune_request_joules", "a request's share of its steps' energy (measured or modeled)",
                       registry=reg, buckets=JOULE_BUCKETS)

    before = served.on_finish

    def on_finish(req: ServedRequest, rec: RequestRecord) -> None:
        before(req, rec)
        if rec.ttft_s is not None:
            ttft.observe(rec.ttft_s)
        for gap in req.token_gaps_s:
            itl.observe(gap)
        queue.observe(rec.queue_s)
        e2e.observe(rec.e2e_s)
        if rec.prefill_time_s is not None:
            prefill_time.observe(rec.prefill_time_s)
        done.labels(rec.finish_reason).inc()
        prompt.inc(rec.prompt_tokens)
        cached.inc(rec.cached_tokens)
        generated.inc(rec.completion_tokens)
        queries.inc(rec.prompt_tokens)
        hits.inc(rec.cached_tokens)
        copied.inc(rec.copied_tokens)
        shifted.inc(rec.shifted_tokens)
        if rec.miss_cause:
            misses.labels(rec.miss_cause).inc()
        if rec.joules is not None:
            energy.observe(rec.joules)

    served.on_finish = on_finish


def make_registry(runner: EngineRunner) -> CollectorRegistry:
    reg = CollectorRegistry()
    reg.register(EngineCollector(runner))
    if runner.served is not None:
        reg.register(ServedCollector(runner.served))
        observe_requests(reg, runner.served)
        mirror_vllm(reg, runner, runner.served, {"ttft": TTFT_BUCKETS_S, "itl": ITL_BUCKETS_S,
                                                 "request": REQUEST_BUCKETS_S})
    return reg

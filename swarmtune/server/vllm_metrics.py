"""The served figures again under vLLM's own metric names (`vllm:num_requests_running`,
`vllm:prefix_cache_hits`, `vllm:time_to_first_token_seconds`, ...) with its `model_name` label, where the
meaning is the same: a fleet dashboard charted for vLLM (its Grafana examples, llm-d's) reads a swarmtune
node as it reads a vLLM one. swarmtune's own names (swarmtune/server/metrics.py) stay the reference; these
mirror them, and nothing is here that is not there."""

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from swarmtune.engine.agents.served import ServedAgents
from swarmtune.engine.agents.served_request import ServedRequest
from swarmtune.engine.record.records import RequestRecord
from swarmtune.server.bridge import model_id
from swarmtune.server.runner import EngineRunner
from swarmtune.server.spec_metrics import spec_counters

LABEL = ["model_name"]


class VllmGauges(Collector):
    def __init__(self, runner: EngineRunner, served: ServedAgents, model: str) -> None:
        self.runner, self.served, self.model = runner, served, model

    def collect(self) -> Iterator[Metric]:
        run = self.runner
        values = [("vllm:num_requests_running", "requests an agent is serving", float(self.served.busy_agents)),
                  ("vllm:num_requests_waiting", "requests queued for an agent", float(self.served.queued))]
        r = run.latest_decode
        if r is not None:
            used = sum(a.context for a in r.agents if a.residency == "cache" and a.state != "preempted")
            budget = run.engine.budget_tokens(r.kv)
            if budget:
                values.append(("vllm:kv_cache_usage_perc", "KV cells held over the KV budget (0-1), as "
                               "swarmtune_kv_cache_usage_ratio", used / budget))
        for name, doc, value in values:
            g = GaugeMetricFamily(name, doc, labels=LABEL)
            g.add_metric([self.model], value)
            yield g
        yield from spec_counters(run, "vllm:spec_decode_", LABEL, [self.model])


def mirror_vllm(reg: CollectorRegistry, runner: EngineRunner, served: ServedAgents,
                buckets: dict[str, tuple[float, ...]]) -> None:
    """buckets: the histograms' bounds by kind (ttft, itl, request), as swarmtune's own use them."""
    model = model_id(runner.engine.facts.path)
    reg.register(VllmGauges(runner, served, model))
    ttft = Histogram("vllm:time_to_first_token_seconds", "arrival to the first token", LABEL, registry=reg,
                     buckets=buckets["ttft"])
    itl = Histogram("vllm:inter_token_latency_seconds", "between a request's tokens", LABEL, registry=reg,
                    buckets=buckets["itl"])
    e2e = Histogram("vllm:e2e_request_latency_seconds", "arrival to the last token", LABEL, registry=reg,
                    buckets=buckets["request"])
    queue = Histogram("vllm:request_queue_time_seconds", "arrival to an agent taking it", LABEL, registry=reg,
                      buckets=buckets["request"])
    prefill_time = Histogram("vllm:request_prefill_time_seconds", "an agent taking it to its first token", LABEL,
                             registry=reg, buckets=buckets["request"])
    prompt = Counter("vllm:prompt_tokens", "prompt tokens of served requests", LABEL, registry=reg)
    generated = Counter("vllm:generation_tokens", "tokens generated for served requests", LABEL, registry=reg)
    queries = Counter("vllm:prefix_cache_queries", "prompt tokens looked up in the cache", LABEL, registry=reg)
    hits = Counter("vllm:prefix_cache_hits", "prompt tokens whose cells were reused", LABEL, registry=reg)
    success = Counter("vllm:request_success", "served requests that ended", ["model_name", "finished_reason"],
                      registry=reg)
    for m in (ttft, itl, e2e, queue, prefill_time, prompt, generated, queries, hits):
        m.labels(model)  # exported at 0 from the start, as vLLM's are: a node that served nothing yet is still seen
    before = served.on_finish

    def on_finish(req: ServedRequest, rec: RequestRecord) -> None:
        before(req, rec)
        if rec.ttft_s is not None:
            ttft.labels(model).observe(rec.ttft_s)
        for gap in req.token_gaps_s:
            itl.labels(model).observe(gap)
        e2e.labels(model).observe(rec.e2e_s)
        queue.labels(model).observe(rec.queue_s)
        if rec.prefill_time_s is not None:
            prefill_time.labels(model).observe(rec.prefill_time_s)
        prompt.labels(model).inc(rec.prompt_tokens)
        generated.labels(model).inc(rec.completion_tokens)
        queries.labels(model).inc(rec.prompt_tokens)
        hits.labels(model).inc(rec.cached_tokens)
        if rec.finish_reason != "cancelled":
            success.labels(model, rec.finish_reason).inc()

    served.on_finish = on_finish

"""Prometheus exposition: fresh metric families from the latest step at each scrape."""

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from swarmtune.engine.server.runner import EngineRunner


class EngineCollector(Collector):
    def __init__(self, runner: EngineRunner) -> None:
        self.runner = runner

    def collect(self):
        run = self.runner
        r = run.latest_decode
        src = run.header.get("source", "") if run.header else ""

        def gauge(name: str, doc: str, value: float | None):
            if value is not None:
                g = GaugeMetricFamily(name, doc, labels=["source"])
                g.add_metric([src], float(value))
                yield g

        yield from gauge("swarmtune_tokens_per_second", "decode tokens per second, rolling 5 s",
                         run.rolling.tokens_per_second)
        yield from gauge("swarmtune_paused", "1 while the engine is paused", 1.0 if run.paused else 0.0)
        steps = CounterMetricFamily("swarmtune_steps", "engine steps since start", labels=["source"])
        steps.add_metric([src], run.rolling.steps_total)
        yield steps
        gen = CounterMetricFamily("swarmtune_generated_tokens", "decode tokens since start", labels=["source"])
        gen.add_metric([src], run.rolling.tokens_total)
        yield gen
        if r is None:
            return
        yield from gauge("swarmtune_batch_size", "agents in the last step", r.batch)
        yield from gauge("swarmtune_batch_cap", "agents allowed per decode step", r.batch_cap)
        yield from gauge("swarmtune_agents", "agents in the swarm", len(r.agents))
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


def make_registry(runner: EngineRunner) -> CollectorRegistry:
    reg = CollectorRegistry()
    reg.register(EngineCollector(runner))
    return reg

"""Speculation's counters (--draft), under swarmtune's names and vLLM's, read from the runner's totals."""

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric

from swarmtune.server.runner import EngineRunner


def spec_counters(run: EngineRunner, prefix: str, labels: list[str], values: list[str]) -> Iterator[Metric]:
    """Speculation since start (--draft): drafts proposed (one agent's, in one step), drafted tokens verified,
    and of those the tokens kept. vLLM's names with prefix "vllm:spec_decode_"."""
    roll = run.rolling
    for name, doc, value in (("num_drafts", "drafts proposed: one agent's, in one step", roll.drafts_total),
                             ("num_draft_tokens", "drafted tokens verified", roll.drafted_total),
                             ("num_accepted_tokens", "drafted tokens kept", roll.accepted_total)):
        c = CounterMetricFamily(prefix + name, doc, labels=labels)
        c.add_metric(values, value)
        yield c

"""A KV switch on the default model: converting the cached K and V in place against prefilling every
history again, at 8 agents of about 900 tokens each.

For each path it prints the seconds the switch took (the swarm is frozen meanwhile) and, per agent, the
KL divergence (nats) of its next-token distribution from a fresh prefill of the same history at the new
type: how far the switched cache is from one made at that type. Last line `convert: X s` (f16 -> --to,
q8_0 by default; K and V apart as `--to q8_0/f16`).

    python bench/kv_switch.py [--threads N] [--context 900] [--to q8_0/f16]
"""

import argparse
import os
import platform

os.environ.setdefault("SWARMTUNE_CHECK", "0")

import numpy as np

from swarmtune.engine.agents.agent import AgentState
from swarmtune.engine.backends.llama_backend import LlamaBackend
from swarmtune.engine.control import Control
from swarmtune.engine.engine import Engine, EngineSettings
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.model.default_model import default_model_path
from swarmtune.engine.model.model_facts import read_model_facts

KV = KVSetting.parse  # a KV setting as a flag spells it


def kl_nats(got: np.ndarray, want: np.ndarray) -> float:
    lw, lg = want - np.logaddexp.reduce(want), got - np.logaddexp.reduce(got)
    return float(np.sum(np.exp(lw) * (lw - lg)))


def kls(e: Engine, fresh: LlamaBackend) -> list[float]:
    out = []
    for a in e.agents:
        if a.state is not AgentState.DECODE or a.next_token is None:
            continue
        got = e.backend.steps.next_logits(a.seq, a.next_token, a.context)
        fresh.open(e.s.kv, 1, e.s.ctx_per_agent)
        for i in range(0, a.context, fresh.max_chunk_tokens):
            fresh.steps.prefill(0, a.history[i:i + fresh.max_chunk_tokens], i)
        out.append(kl_nats(got, fresh.steps.next_logits(0, a.next_token, a.context)))
    return out


def switch(e: Engine, kv: KVSetting, convert: bool) -> tuple[float, str]:
    e.s.kv_convert = convert
    e.request(Control(kv=kv))
    r = e.step()
    assert r.kind == "rebuild", r.kind
    e.check_caches()
    return r.seconds + r.residency_seconds, r.note


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--context", type=int, default=900, help="tokens per agent before the switch")
    ap.add_argument("--to", type=KVSetting.parse, default="q8_0",
                    help="the KV setting switched to (and back from): a type or K/V")
    a = ap.parse_args()
    facts = read_model_facts(default_model_path())
    backend = LlamaBackend(facts, n_threads=a.threads)
    fresh = LlamaBackend(facts, n_threads=a.threads)
    s = EngineSettings(agents=8, ctx_per_agent=2048, gen_tokens=32, tool_tokens=448, seed=3, check=False)
    e = Engine(backend, s)
    while min((x.context for x in e.agents), default=0) < a.context or any(
            x.state is not AgentState.DECODE for x in e.agents):
        e.step()
    tokens = sum(x.context for x in e.agents)
    print(f"{platform.processor() or platform.machine()}, {backend.n_threads} threads; 8 agents, {tokens} cached "
          f"tokens (mean {tokens / 8:.0f}) at f16 (measured)")
    results = {}
    for kv, convert in ((a.to, True), (KV("f16"), True), (a.to, False), (KV("f16"), False)):
        seconds, note = switch(e, kv, convert)
        k = kls(e, fresh)
        how = "convert" if convert else "re-prefill"
        results[(kv, how)] = seconds
        print(f"{how:10s} -> {kv:8s}: {seconds:6.2f} s; next-token KL vs a fresh prefill at {kv}: median "
              f"{np.median(k):.5f}, max {max(k):.5f} nats over {len(k)} agents  [{note}]", flush=True)
    print(f"convert: {results[(a.to, 'convert')]:.2f} s (re-prefill {results[(a.to, 're-prefill')]:.2f} s)")
    fresh.close()
    e.close()


if __name__ == "__main__":
    main()

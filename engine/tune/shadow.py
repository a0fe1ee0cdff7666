"""A shadow of the live engine on a simulator (what every forecast runs): built from the engine's public
snapshot, every agent copied as it stands, so that it runs on from here as the live swarm would."""

from dataclasses import replace

from swarmtune.engine.agents.agent import AgentState, Residency
from swarmtune.engine.backends.clock import SimClock
from swarmtune.engine.backends.sim_backend import SimBackend
from swarmtune.engine.engine import Engine
from swarmtune.engine.engine_view import EngineView
from swarmtune.engine.measure.power.meter import Meter
from swarmtune.engine.settings import EngineSettings


def shadow_of(live: EngineView, sim: SimBackend, settings: EngineSettings, meter: Meter | None = None) -> Engine:
    """Every agent as it stands (its history, turn, tool wait, residency), the clock, the step count, the
    batch-1 reference's schedule. Its cache holds what the live one holds. The shadow's samplers draw their
    own tokens: what it forecasts is time, not text."""
    snap = live.snapshot()
    shadow = Engine(sim, settings, meter=meter)
    shadow.resume_from(snap, SimClock(snap.now_s))
    sim.open(snap.kv, snap.slots, snap.ctx_per_agent)
    shadow.analysis.context_opened()
    shadow.analysis.forecasting = True
    shadow.analysis.carry_references(snap.analysis)
    for a in snap.agents:
        b = replace(a, history=list(a.history), pending=list(a.pending), tool_pending=list(a.tool_pending),
                    messages=list(a.messages), swapped=None, kept=list(a.kept))
        b.fold_kept()  # the shadow prefills them: its cost model has no paste
        if a.residency is Residency.HOST:
            b.swapped = sim.saved_stand_in(snap.kv, a.context)
        elif a.state is not AgentState.PREEMPTED and a.context:
            sim.adopt_cached(a.seq, a.context)
        if b.next_token is not None:
            b.next_token = sim.text.tokenize(" x")[0]
        if b.state is AgentState.CLIENT and b.tool_ready_at is None:
            # a served agent waits for its client: in the shadow its client comes back as the traffic does
            # (engine/agents/served.py's shape: the median wait, then what a returning turn adds)
            b.wait_for_tool(sim.text.tokenize(" x" * settings.tool_tokens)[: settings.tool_tokens],
                            snap.now_s + settings.tool_latency_s)
        shadow.workload.seed_sampler(b)
        shadow.agents.append(b)
    return shadow

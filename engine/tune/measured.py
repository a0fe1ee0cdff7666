"""What the tuner learned of this machine, kept across a restart: each KV type's prefill chunks, the rates
of swaps, conversions and its own switches, and side-cache probes of KV types the run has not run. The
forecasts run on it (the swarm's simulator, calibrated on it) and a switch is priced by it."""

import time

from swarmtune.engine.agents.agent import Agent, AgentState, Residency
from swarmtune.engine.backends.backend import NoKVSlot
from swarmtune.engine.backends.sim_backend import SimBackend
from swarmtune.engine.engine_view import EngineView
from swarmtune.engine.errors import UserError
from swarmtune.engine.kv.convert import Unconvertible
from swarmtune.engine.kv.types import F16, KVSetting
from swarmtune.engine.measure.kv_probe import (
    PROBE_STEPS,
    SHORT_CONTEXT,
    KvProbe,
    long_context,
    probe_kv,
    probe_kv_converted,
)
from swarmtune.engine.measure.prefill_model import PrefillCalibration
from swarmtune.engine.model.profiles import Profile
from swarmtune.engine.record.records import StepRecord, mean_context
from swarmtune.engine.tune.cost import Spending
from swarmtune.engine.tune.events import Probed, TuneEvent
from swarmtune.engine.tune.simulator import CalibratedSim

# a KV type's own fit stands for it once it has this many steps; before, its probe (timed in a side cache)
# does: a fit of a few steps at one batch size says little about the others
MIN_OWN_FIT_SAMPLES = 32
# a switch's seconds, before one was measured: cached bytes over this rate, twice (save and convert, restore).
# Measured on a 2-core Xeon: 8 x 1,050 tokens of the default model (0.19 GB at f16) switched in 0.61 s
CONVERT_BYTES_PER_S = 0.6e9
# and a new llama.cpp context of the other type, before one was measured (0.2-0.3 s on the 2-core CPUs here
# at 8 x 2,048 cells), or what opening the run's own context took where that is more: it grows with the
# cells (8 x 8,192 cells of the default model: 2.0-2.4 s at f16, 0.9 s at q8_0 on a 2-core EPYC)
SWITCH_FIXED_S = 0.25


class Measured:
    def __init__(self) -> None:
        self.prefill: dict[KVSetting, PrefillCalibration] = {}  # per KV setting: measured prefill chunks
        self.swap: list[tuple[int, float]] = []  # (bytes, seconds) of measured swaps
        self.probes: dict[KVSetting, KvProbe | None] = {}  # KV setting -> its probe (None: it could not be timed)
        self.convert: list[tuple[int, float]] = []  # (bytes, seconds) of measured KV conversions
        self.switches: list[tuple[float, float]] = []  # (cached tokens, seconds) of the tuner's KV switches
        # KV types this build could not make (a rebuild's record, or a probe): no candidates
        self.refused: set[KVSetting] = set()

    def learn(self, rec: StepRecord) -> None:
        """A measured step's prefill chunk and moves join what is known of this machine; a KV type a rebuild
        could not make, what this build refuses."""
        if rec.refused_kv is not None:
            self.refused.add(KVSetting.parse(rec.refused_kv))
        if rec.source != "measured":
            return
        if rec.kind == "prefill" and rec.seconds > 0 and rec.tokens and rec.batch_ids:
            after = next((a.context for a in rec.agents if a.id == rec.batch_ids[0]), None)
            if after is not None:
                self.prefill.setdefault(rec.kv, PrefillCalibration()).add(rec.tokens, after - rec.tokens,
                                                                                rec.seconds)
        for m in rec.moved:
            if m.op in ("swap_out", "swap_in") and m.seconds > 0:
                self.swap = (self.swap + [(m.bytes, m.seconds)])[-64:]
            if m.op == "convert" and m.seconds > 0:
                self.convert = (self.convert + [(m.bytes, m.seconds)])[-64:]

    def switched(self, cells: float, seconds: float) -> None:
        """One of the tuner's KV switches: the cells it converted or prefilled, and its seconds."""
        self.switches = (self.switches + [(cells, seconds)])[-16:]

    def unprobed(self, engine: EngineView, candidates: set[KVSetting]) -> list[KVSetting]:
        """The candidate KV types a forecast has no step time of this machine for: never probed, and not
        run long enough for a fit of their own."""
        return sorted((k for k in candidates - set(self.probes)
                       if (own := engine.analysis.fit(k)) is None or own.samples < MIN_OWN_FIT_SAMPLES), key=str)

    def probe_missing(self, engine: EngineView, base_kv: KVSetting, candidates: set[KVSetting],
                      cost: Spending, source: Agent | None = None) -> list[TuneEvent]:
        """Times each candidate KV type that has not run against the run's own (base_kv), once per run, at
        the widest batch a candidate can have: a forecast of switching to it needs its step time on this
        machine. source: an agent whose history in the live cache the side caches are given, converted
        (engine/measure/kv_probe.py), rather than prefilling one. Its seconds are the tuner's probe cost."""
        out: list[TuneEvent] = []
        ctx = [a.context for a in engine.agents]
        for k in self.unprobed(engine, candidates):
            long = long_context(mean_context(ctx), engine.s.ctx_per_agent)
            try:
                t0 = time.perf_counter()
                try:
                    if source is None:
                        p = probe_kv(engine.backend, base_kv, k, len(engine.agents), long)
                    else:
                        p = probe_kv_converted(engine.backend, base_kv, k, len(engine.agents), source.seq,
                                               min(long, source.context))
                finally:
                    cost.probe_s += time.perf_counter() - t0
            except (UserError, NoKVSlot, RuntimeError, ValueError, Unconvertible) as e:
                self.probes[k] = None
                if isinstance(e, UserError):  # this build cannot make a cache of that type: not a candidate
                    self.refused.add(k)
                out.append(Probed(kv=k, base_kv=base_kv, error=str(e),
                                  why=f"tune: KV {k} could not be timed in a side cache ({e}); "
                                      + ("it is no candidate" if isinstance(e, UserError) else
                                         f"its forecasts borrow KV {base_kv}'s step time, unscaled")))
                continue
            self.probes[k] = p
            bm = engine.facts.bytes_model
            # what the side caches timed joins each type's fit as steps of the run do, fading as they do: at
            # the start they are all there is; they are not counted in the run's prequential error
            for kv, points in p.decode.items():
                cal = engine.analysis.calibration(kv)
                for batch, context, seconds in points:
                    longest = bm.kv_equivalent_tokens(kv, context)
                    cal.add(batch, batch * longest, seconds, longest=longest, checked=False)
                cal.refit()
            for kv, chunks in p.prefill.items():
                for tokens, pos0, seconds in chunks:
                    self.prefill.setdefault(kv, PrefillCalibration()).add(tokens, pos0, seconds, pinned=True)
            fixed, per_token = p.ratios
            what = (f"attention {per_token:.2f}x per token, the rest {fixed:.2f}x" if p.split else
                    f"the whole step {fixed:.2f}x (attention too small here to time apart)")
            figures = {k: v for k, v in p.record().items() if k not in ("kv", "base_kv")}
            how = "" if source is None else f" on agent {source.id}'s history, converted,"
            err = self.probe_error(engine, k)
            noise = "" if err is None else (f"; within its steps' spread a step at {err[1]:,.0f} tokens may be "
                                            f"{err[0]:.0%} off that (measured)")
            out.append(Probed(kv=p.kv, base_kv=p.base_kv, figures=figures,
                              why=f"tune: timed KV {k} against {base_kv} in a side cache{how} ({p.wall_s:.1f} s, batch "
                                  f"{p.batch}, contexts {p.contexts[0]} and {p.contexts[1]}): {what} (measured)"
                                  + noise))
        return out

    def step_time_source(self, engine: EngineView, kv: KVSetting) -> str:
        """Where a forecast's step times at this KV type come from."""
        own = engine.analysis.fit(kv)
        p = self.probes.get(kv)
        if own is not None and (own.samples >= MIN_OWN_FIT_SAMPLES or p is None):
            return f"fitted on this run's {own.samples} steps at {kv}"
        if p is not None and engine.analysis.fit(p.base_kv) is not None:
            return f"KV {p.base_kv}'s fit scaled by a side-cache probe of both (modeled from measured ratios)"
        return "borrowed from another KV type's fit, unscaled (never timed at this type)"

    def probe_error(self, engine: EngineView, kv: KVSetting) -> tuple[float, float] | None:
        """Where kv's forecasts stand on its side-cache probe (no fit of its own yet): how far their step times
        may be off for the probe's noise (engine/measure/kv_probe.py's step_error) at the longest context a
        forecast reaches (each agent's share of the KV budget at kv, or its context limit; no less than the
        swarm's mean now), and that context. None where they do not."""
        p = self.probes.get(kv)
        own = engine.analysis.fit(kv)
        if p is None or (own is not None and own.samples >= MIN_OWN_FIT_SAMPLES):
            return None
        reach = float(engine.s.ctx_per_agent)
        if engine.s.kv_budget_bytes is not None:
            reach = min(reach, engine.budget_tokens(kv) / max(len(engine.agents), 1))
        reach = max(reach, mean_context([a.context for a in engine.agents]))
        return p.step_error(reach), reach

    def simulator(self, engine: EngineView) -> SimBackend | None:
        """The swarm's simulator: the card as stated on the sim, else this run calibrated."""
        b = engine.backend
        if isinstance(b, SimBackend):  # the card as its profile states it (the card itself, unless mis-stated)
            return SimBackend(b.stated)
        own = {kv: fit for kv in engine.analysis.measured_kv() if (fit := engine.analysis.fit(kv)) is not None}
        prefills = {kv: c.fit for kv, c in self.prefill.items() if c.fit is not None}
        if not own or not prefills:
            return None  # nothing measured yet to simulate this machine with
        fits = dict(own)
        for kv, p in self.probes.items():
            young = kv not in own or own[kv].samples < MIN_OWN_FIT_SAMPLES
            if p is not None and young and p.base_kv in own:
                fits[kv] = p.scale(own[p.base_kv])
        now_prefill = prefills.get(engine.s.kv) or next(iter(prefills.values()))
        swap_bw = (sum(b for b, _ in self.swap) / sum(s for _, s in self.swap)) if self.swap else 10e9
        f = engine.facts
        prof = Profile(name="calibrated", description="this run, calibrated", model_name=f.name,
                    weight_bytes=f.weight_bytes, kv_bytes_per_token_f16=f.bytes_model.kv_bytes_per_token(F16),
                    effective_bandwidth_bytes_per_s=1.0, compute_seconds_per_token=0.0,
                    prefill_tokens_per_s=1 / now_prefill.per_token_seconds,
                    kv_budget_bytes=engine.s.kv_budget_bytes or 0.0,
                    context_per_agent=engine.s.ctx_per_agent, n_ctx_train=f.n_ctx_train, power_floor_watts=0.0,
                    power_per_agent_watts=0.0, source="calibrated on this run (modeled)", layers=f.bytes_model,
                    host_link_bytes_per_s=swap_bw)
        return CalibratedSim(prof, fits, prefills, engine.s.kv)

    @staticmethod
    def history_to_probe(engine: EngineView) -> Agent | None:
        """The agent whose history a probe by conversion is given: the longest one held in the live cache
        from position 0, once one holds twice the probe's short point (so that the two points differ);
        None before."""
        b = engine.backend
        held = [a for a in engine.agents if a.residency is Residency.CACHE and a.seq < b.n_seqs
                and a.context >= 2 * SHORT_CONTEXT]
        src = max(held, key=lambda a: a.context, default=None)
        if src is None or b.cells.span(src.seq) != (0, src.context - 1):
            return None
        return src

    def convert_probe_s(self, engine: EngineView, base_kv: KVSetting, kvs: list[KVSetting], tokens: int,
                        step_s: float) -> float:
        """What probing kvs on a history of `tokens`, converted, is expected to take before it runs: per type
        a new context, the history converted and restored (at the rate this run's conversions measured, else
        CONVERT_BYTES_PER_S), and its decode points at step_s a step (the swarm's latest)."""
        bm = engine.facts.bytes_model
        rate = sum(b_ for b_, _ in self.convert) / sum(s for _, s in self.convert) if self.convert \
            else getattr(engine.backend, "convert_bytes_per_s", CONVERT_BYTES_PER_S)
        per_type = SWITCH_FIXED_S + 2 * bm.kv_cache_bytes(base_kv, tokens) / rate + PROBE_STEPS * step_s
        return (len(kvs) + 1) * per_type

    def readmit_s(self, engine: EngineView, a: KVSetting, b: KVSetting) -> float:
        """What going between KV types a and b costs the swarm beyond the rebuild while the KV budget holds
        agents out (preempted, their histories waiting to be prefilled again): the type that holds more
        admits them and prefills them, the other evicts them again, so every switch of an experiment
        prefills again about the two budgets' difference (at most what waits). At this run's prefill fit
        (on the sim, the card's stated rate); 0 where nothing waits, no budget is set or no rate is known."""
        if a == b or engine.s.kv_budget_bytes is None:
            return 0.0
        waiting = [x for x in engine.agents if x.state is AgentState.PREEMPTED and x.pending]
        total = sum(len(x.pending) for x in waiting)
        tokens = min(total, abs(engine.budget_tokens(a) - engine.budget_tokens(b)))
        if tokens <= 0:
            return 0.0
        if isinstance(engine.backend, SimBackend):
            return tokens / engine.backend.stated.prefill_tokens_per_s
        cal = self.prefill.get(engine.s.kv) or next(iter(self.prefill.values()), None)
        fit = None if cal is None else cal.fit
        if fit is None:
            return 0.0
        # each waiting history prefilled from position 0, the share of them the swing admits
        return sum(fit.seconds(len(x.pending), 0) for x in waiting) * tokens / total

    def switch_s(self, engine: EngineView, kv: KVSetting) -> float:
        """What one KV switch from kv is expected to cost: its rebuild, at the rate this run's switches
        measured (cells per second), else a new context (as long as the run's own took to open, at least
        SWITCH_FIXED_S) and its cells converted at CONVERT_BYTES_PER_S."""
        fixed = 0.0 if engine.backend.source == "simulated" else max(SWITCH_FIXED_S, engine.analysis.open_s or 0.0)
        cells = sum(x.context for x in engine.agents)
        if self.switches:
            per_cell = sum(s for _, s in self.switches) / max(sum(c for c, _ in self.switches), 1.0)
            return cells * per_cell
        bm = engine.facts.bytes_model
        cached = sum(bm.kv_cache_bytes(kv, x.context) for x in engine.agents)
        rate = sum(b_ for b_, _ in self.convert) / (2 * sum(s for _, s in self.convert)) if self.convert \
            else getattr(engine.backend, "convert_bytes_per_s", CONVERT_BYTES_PER_S)
        return fixed + 2 * cached / rate

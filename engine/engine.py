"""The engine: drives a swarm of agents through one backend, one step at a time, and says what each
step did. The caller owns the loop (record, dashboard, server); controls may arrive from any thread
and take effect at the start of the next step."""

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Protocol

import swarmtune
from swarmtune.engine.agent_source import AgentSource
from swarmtune.engine.analysis import StepAnalysis
from swarmtune.engine.backend import Backend, CacheMismatch, NoKVSlot
from swarmtune.engine.clock import Clock
from swarmtune.engine.control import Control
from swarmtune.engine.errors import Interrupted, Stalled, UserError
from swarmtune.engine.kv_switch import Converted, convert_histories, restore_histories
from swarmtune.engine.power.meter import Meter, NoMeter
from swarmtune.engine.recorder import Recorder
from swarmtune.engine.records import StepRecord, mean_context
from swarmtune.engine.residency import MoveLog, Parking
from swarmtune.engine.scheduler import Plan, Scheduler
from swarmtune.engine.settings import (
    EngineSettings,
    cap_in_force,
    check_agents,
    check_batch_cap,
    check_kv,
    check_residency,
    min_context,
)
from swarmtune.engine.speedup import BatchOneReference
from swarmtune.engine.step_model import Calibration
from swarmtune.engine.tune_events import TuneEvent
from swarmtune.engine.workload import Agent, AgentState, Residency, Workload


class TunerHook(Protocol):
    """What the engine asks of a tuner (engine/tune/): it sees every record and turns the controls only
    through `Engine.request`, as a person would."""

    def prepare(self, engine: "Engine") -> list[TuneEvent]: ...

    def observe(self, engine: "Engine", rec: StepRecord) -> list[TuneEvent]: ...

    def restart(self) -> None: ...


class QualityHook(Protocol):
    """The live KV quality check (engine/quality_check.py): sees every record, now and then measures."""

    def observe(self, engine: "Engine", rec: StepRecord) -> list[TuneEvent]: ...


@dataclass
class EngineState:
    """What a control answer reports: the settings now in force (or about to be, at the next step). Derived
    each time from the engine's settings and the change still pending (`Engine.state`), never kept."""
    batch_cap: int
    kv: str
    agents: int
    residency: str = "keep"
    autotune: bool | None = None  # None: this engine has no tuner


@dataclass(frozen=True)
class EngineSnapshot:
    """An engine's state as a shadow needs it to run on from here (Engine.snapshot)."""
    slots: int
    kv: str
    ctx_per_agent: int
    now_s: float
    step_index: int
    since_reference: int  # decode steps since the last batch-1 reference step
    agents: tuple[Agent, ...]
    analysis: StepAnalysis


class Engine:
    def __init__(self, backend: Backend, settings: EngineSettings,
                 progress: Callable[[str, int, int], None] | None = None, meter: Meter | None = None,
                 tuner: "TunerHook | None" = None, autotune: bool = False, agents: AgentSource | None = None,
                 quality: "QualityHook | None" = None) -> None:
        settings.validate(backend.facts.n_ctx_train)
        self.backend = backend
        self.facts = backend.facts
        # a prefill chunk never exceeds what one backend call may carry
        self.s = replace(settings, batch_cap=cap_in_force(settings.batch_cap, settings.agents),
                         chunk_tokens=min(settings.chunk_tokens, backend.max_chunk_tokens))
        self.progress = progress or (lambda what, done, total: None)
        # what drives the agents (engine/agent_source.py): the synthetic swarm unless told otherwise
        self.workload: AgentSource = agents or Workload(backend, self.s.seed, self.s.gen_tokens, self.s.tool_tokens,
                                 self.s.tool_latency_s, self.s.tool_latency_sigma)
        self.slots = max(self.s.agents, 1)
        self.agents: list[Agent] = []
        self._budgets: dict[tuple[str, int, float | None], int] = {}  # budget_tokens, computed once per key
        # it reads the batch cap and the chunk from the settings, the budget from the KV type in force
        self.scheduler = Scheduler(self.s, lambda: self.budget_tokens(self.s.kv))
        min_need = min_context(self.s)
        if self.budget_tokens(self.s.kv) < min_need:
            raise UserError(f"the KV budget holds {self.budget_tokens(self.s.kv)} tokens at {self.s.kv}; "
                            f"not even one agent fits (needs {min_need})")
        self._since_reference = 0
        self.step_index = 0
        self.clock: Clock = backend.new_clock()  # the wall's, or a simulated card's modeled seconds
        # what was requested and not yet applied, as one change (a later request's fields win); the settings in
        # force are self.s (and self.autotune): state() is the one with the other over it
        self._pending = Control()
        self._lock = threading.Lock()
        self.tuner = tuner  # engine/tune/: watches every record, turns the controls through request()
        self.quality = quality  # engine/quality_check.py: the live KV quality check, where there is one
        self.autotune = autotune and tuner is not None
        self.started = False
        self.started_at = ""
        self.run_id = ""
        self.meter = meter or NoMeter("n/a: no power source chosen")
        self.analysis = StepAnalysis(self.facts, backend.source, self.meter.watts_at)
        self.recorder = Recorder(backend, self.s, self.analysis)
        self.should_stop: Callable[[], bool] = lambda: False  # checked between the chunks of a long rebuild
        # a pause is wanted: the tuner's look (seconds of forecasting on a big simulated swarm) gives way
        self.should_yield: Callable[[], bool] = lambda: False
        self._step_t0 = 0.0
        # histories moved since the last record (swaps out and in, drops, conversions, pastes), and where a
        # waiting agent's history lives
        self.moves = MoveLog("modeled" if backend.source == "simulated" else "measured")
        self.parking = Parking(backend, self.s, self.moves)
        self.refused_kv: set[str] = set()  # KV types this build could not make
        self._queued: list[StepRecord] = []  # the tuner's records, handed out before the next step

    # setup
    def budget_tokens(self, kv: str) -> int:
        """The tokens of full-attention cache the KV budget holds at this type, over every agent."""
        key = (kv, self.slots, self.s.kv_budget_bytes)
        if key not in self._budgets:
            self._budgets[key] = self._budget_for(kv)
        return self._budgets[key]

    def _budget_for(self, kv: str) -> int:
        if self.s.kv_budget_bytes is None:
            return self.slots * self.s.ctx_per_agent
        # each agent's window cells (windowed layers keep window + one ubatch) and recurrent state are fixed
        # costs; the full-attention layers' tokens share what is left
        return self.facts.bytes_model.budget_tokens(self.s.kv_budget_bytes, kv, self.slots, self.s.ctx_per_agent,
                                                    swa_slack_tokens=self.s.chunk_tokens)

    def snapshot(self) -> EngineSnapshot:
        """What a shadow of this engine starts from (engine/tune/shadow.py): the agents are the live ones,
        for the shadow to copy, not to change."""
        return EngineSnapshot(slots=self.slots, kv=self.s.kv, ctx_per_agent=self.s.ctx_per_agent,
                              now_s=self.now_s(), step_index=self.step_index,
                              since_reference=self._since_reference, agents=tuple(self.agents),
                              analysis=self.analysis)

    def resume_from(self, snap: EngineSnapshot, clock: Clock) -> None:
        """In place of start(): this engine goes on from another's snapshot, on this clock (its agents are
        the caller's to add, its cache the caller's to fill)."""
        self.slots = snap.slots
        self._since_reference = snap.since_reference
        self.clock = clock
        self.started = True
        self.step_index = snap.step_index

    @property
    def calibration(self) -> Calibration:
        return self.analysis.calibration(self.s.kv)

    @property
    def reference(self) -> BatchOneReference:
        return self.analysis.reference(self.s.kv)

    def start(self) -> None:
        self.backend.open(self.s.kv, self.slots, self.s.ctx_per_agent)
        self.analysis.context_opened()
        for i in range(self.s.agents):
            self._new_agent(i)
        self.clock.start()
        self.started_at = datetime.now(UTC).isoformat(timespec="seconds")
        self.run_id = uuid.uuid4().hex[:12]
        self.started = True
        if self.autotune and self.tuner is not None:
            # on the run's clock: what the tuner measures before the first step (the KV types it may use) costs
            # the swarm its time
            self._queued += [self.tune_record(note) for note in self.tuner.prepare(self)]

    def _new_agent(self, agent_id: int) -> Agent:
        used = {a.seq for a in self.agents}
        seq = next(s for s in range(self.slots) if s not in used)
        a = Agent(id=agent_id, seq=seq, limit=self.s.ctx_per_agent)
        self.workload.start_task(a)
        self.agents.append(a)
        return a

    def header(self) -> dict[str, object]:
        b = self.backend
        return {
            "model": {"name": self.facts.name, "path": self.facts.path, "architecture": self.facts.architecture},
            "weight_bytes": self.facts.weight_bytes,
            "embd_row_bytes": self.facts.embd_row_bytes,
            "kv_bytes_per_token": self.facts.kv_bytes_per_token_all(),
            # what a step reads, layer by layer: windows, experts, recurrent state (engine/bytes_model.py)
            "bytes_model": self.facts.bytes_model.to_dict(),
            "kv_buffer_bytes_reported": getattr(b, "kv_buffer_bytes", None),
            "cache_bytes_reported": getattr(b, "cache_bytes", None) or None,  # kv, kv_swa, recurrent (llama.cpp log)
            "backend": b.info.name,
            "device": b.info.device,
            "versions": {"swarmtune": swarmtune.__version__, **b.info.versions},
            "settings": {**asdict(self.s), **b.info.settings, "slots": self.slots},
            "source": b.source,
            "reference": self.reference.as_dict(),
            "power": {"source": self.meter.label, "detail": self.meter.reason},
            "started_at": self.started_at,
            "run_id": self.run_id,  # step indexes restart with each run; a client resuming by index checks it
        }

    # controls: validated now, in the caller's thread; applied at the next step
    def request(self, c: Control) -> EngineState:
        """Checked here, for every caller, in one wording; applied at the next step."""
        batch_cap, kv, agents, residency, autotune = c.batch_cap, c.kv, c.agents, c.residency, c.autotune
        with self._lock:
            if autotune is not None and self.tuner is None:
                raise UserError("this engine has no tuner", field="autotune")
            st = self._state()
            n_agents = check_agents(agents) if agents is not None else st.agents
            if batch_cap is not None:
                check_batch_cap(batch_cap, n_agents)
            if kv is not None:
                kv = check_kv(kv)  # one spelling: "q8_0/q8_0" is "q8_0"
                c = replace(c, kv=kv)
                if self.s.kv_budget_bytes is not None:
                    budget = self.budget_tokens(kv)
                    if budget < min_context(self.s):
                        raise UserError(f"the KV budget holds only {budget} tokens at {kv}", field="kv_type")
            if residency is not None:
                check_residency(residency)
            self._pending = self._pending.then(c)
            return self._state()

    def set_workload(self, gen_tokens: int | None = None, tool_tokens: int | None = None,
                     tool_latency_s: float | None = None) -> None:
        """The synthetic swarm's turns change shape from the next turn on (a bench's phases: agents that
        read large tool results, then write long answers). A forecast made after it sees the new shape,
        as it would see a real swarm's present traffic."""
        if gen_tokens is not None:
            self.s.gen_tokens = self._synthetic().gen_tokens = gen_tokens
        if tool_tokens is not None:
            self.s.tool_tokens = self._synthetic().tool_tokens = tool_tokens
        if tool_latency_s is not None:
            self.s.tool_latency_s = self._synthetic().tool_latency_s = tool_latency_s

    def _synthetic(self) -> Workload:
        if not isinstance(self.workload, Workload):
            raise UserError("only the synthetic swarm's turns can be reshaped")
        return self.workload

    def state(self) -> EngineState:
        """The settings in force with the change requested and not yet applied over them: what the next step
        runs with (a KV type being rebuilt to included)."""
        with self._lock:
            return self._state()

    def _state(self) -> EngineState:
        p, s = self._pending, self.s
        agents = p.agents if p.agents is not None else s.agents
        return EngineState(
            batch_cap=cap_in_force(p.batch_cap if p.batch_cap is not None else s.batch_cap, agents),
            kv=p.kv or s.kv,
            agents=agents,
            residency=p.residency or s.residency,
            autotune=None if self.tuner is None else (p.autotune if p.autotune is not None else self.autotune),
        )

    def _applied(self, done: Control) -> None:
        """done has taken effect: what is left pending is what was requested since (or differently)."""
        with self._lock:
            self._pending = self._pending.less(done)

    def _apply_controls(self) -> StepRecord | None:
        # the change stays pending while it is applied (state() reads the same all along); a request from
        # another thread meanwhile is kept for the next step
        with self._lock:
            c = self._pending
        if c.agents is not None:
            self._set_agents(c.agents)
        if c.batch_cap is not None:
            self.s.batch_cap = c.batch_cap
        if c.residency is not None:
            self.s.residency = c.residency  # where the next agent to call a tool parks its history
        if c.autotune is not None and c.autotune != self.autotune:
            self.autotune = c.autotune
            if c.autotune and self.tuner is not None:
                self.tuner.restart()  # it measures from now, not from before it was turned off
        self.s.batch_cap = cap_in_force(self.s.batch_cap, len(self.agents))
        rebuild_to = c.kv if c.kv is not None and c.kv != self.s.kv else None
        # a new KV type stays pending until the rebuild to it ends (or is refused)
        if c:
            self._applied(replace(c, kv=None) if rebuild_to is not None else c)
        if rebuild_to is not None or self.backend.n_seqs < self.slots:
            return self._rebuild(rebuild_to or self.s.kv)
        return None

    def _set_agents(self, n: int) -> None:
        while len(self.agents) > n:
            # a served agent waiting for its client goes first: one serving a request takes it with it
            a = max(self.agents, key=lambda x: (x.state is AgentState.TOOL and x.waits_for == "client", x.id))
            self.backend.drop(a.seq)
            self.agents.remove(a)
        next_id = max((a.id for a in self.agents), default=-1) + 1
        while len(self.agents) < n:
            if len(self.agents) >= self.slots:
                self.slots *= 2  # the next step rebuilds the context with room for more streams
            a = Agent(id=next_id, seq=-1, limit=self.s.ctx_per_agent)
            a.seq = next(s for s in range(self.slots) if s not in {x.seq for x in self.agents})
            self.agents.append(a)
            if a.seq < self.backend.n_seqs:
                self.workload.start_task(a)
            next_id += 1
        self.s.agents = n

    # one step
    def step(self) -> StepRecord:
        if self._queued:
            return self._queued.pop(0)
        if not self.started:
            self.start()
            if self._queued:
                return self._queued.pop(0)
        rec = self._step()
        self.workload.on_record(rec)
        if self.s.check:
            self.check_caches()
        if self.quality is not None:  # before the tuner: what it measures, the tuner reads at once
            for note in self.quality.observe(self, rec):
                self._queued.append(self.tune_record(note))
        if self.autotune and self.tuner is not None:
            for note in self.tuner.observe(self, rec):
                self._queued.append(self.tune_record(note))
        return rec

    def tune_record(self, tune: TuneEvent) -> StepRecord:
        """A tuner's decision (or its measured outcome) as a record of its own, kind "tune"."""
        views = self.recorder.views("tune", [], self.agents)
        rec = StepRecord(step=self.step_index, t=round(self.now_s(), 6), kind="tune", batch=0, batch_ids=[],
                         batch_cap=self.s.batch_cap, kv_type=self.s.kv, agents=views,
                         weight_bytes=0, kv_bytes=0.0, seconds=0.0, tokens=0, source=self.backend.source,
                         note=tune.why_text, tune=tune)
        self.step_index += 1
        return rec

    def now_s(self) -> float:
        """The engine's clock: simulated seconds on the sim backend, wall seconds since start otherwise."""
        return self.clock.now_s()

    def check_caches(self) -> None:
        """Every live agent's cells are exactly its history (positions 0..len-1); every other sequence is
        empty. Raises CacheMismatch: a cache that lost or gained tokens makes every later number fiction."""
        used: set[int] = set()
        bm = self.facts.bytes_model
        # windowed layers drop cells past their window, and a recurrent state holds only its last position:
        # there the first position held may be past 0, the last one never differs
        keeps_all = not bm.has_swa and not bm.state_bytes
        for a in self.agents:
            if a.seq >= self.backend.n_seqs:
                continue  # added beyond the open streams: it starts at the next rebuild
            used.add(a.seq)
            lo, hi = self.backend.cells(a.seq)
            if a.residency is not Residency.CACHE or not a.context:
                ok = (lo, hi) == (-1, -1)
            else:
                ok = hi == a.context - 1 and (lo == 0 if keeps_all else 0 <= lo <= hi)
            if not ok:
                raise CacheMismatch(f"agent {a.id} (sequence {a.seq}, {a.state.value}) has {a.context} tokens of "
                                    f"history but its cache holds positions {lo}..{hi}")
        for seq in range(self.backend.n_seqs):
            if seq not in used and self.backend.cells(seq) != (-1, -1):
                raise CacheMismatch(f"sequence {seq} belongs to no agent but holds positions {self.backend.cells(seq)}")

    def _step(self) -> StepRecord:
        self._step_t0 = time.perf_counter()
        rec = self._apply_controls()
        if rec is not None:
            return rec
        self.workload.before_step(self.agents, self.now_s())  # requests that arrived go to their agents here
        if (shape := self.workload.traffic()) is not None:  # served traffic: the forecasts run what it looks like
            self.s.gen_tokens, self.s.tool_tokens = shape.gen_tokens, shape.tool_tokens
            self.s.tool_latency_s = shape.wait_s
        self._wake_tools()
        plan = self.scheduler.schedule(self.agents, self.step_index)
        preempted = [a.id for a in plan.preempt or []]
        for a in plan.preempt or []:
            self._preempt(a)
        if plan.kind == "prefill":
            return self._prefill_step(plan, preempted)
        if plan.kind == "decode" and plan.agents:
            return self._decode_step(plan, preempted)
        if any(a.state is AgentState.TOOL for a in self.agents):
            return self._idle_step()
        raise Stalled("no agent can run: the KV budget is too small for the swarm")

    def _preempt(self, a: Agent) -> None:
        if a.state is AgentState.TOOL:  # a waiting agent keeps waiting; its history is prefilled on return
            self.parking.drop(a)
            return
        self.backend.drop(a.seq)
        a.requeue()
        a.state = AgentState.PREEMPTED

    def _wake_tools(self) -> None:
        """Tool results that have arrived: the agent's history comes back (swapped in, or prefilled again
        with the result) and the result is queued for prefill."""
        now = self.now_s()
        for a in self.agents:
            if a.state is not AgentState.TOOL or a.tool_ready_at is None or a.tool_ready_at > now:
                continue
            if a.residency is Residency.HOST:
                self.parking.swap_in(a, self.budget_tokens(self.s.kv) - self.scheduler.used_tokens(self.agents))
            a.pending = a.pending + a.tool_pending
            a.tool_pending, a.tool_ready_at = [], None
            a.residency = Residency.CACHE  # its prefill (history, if dropped, then the result) refills the cells
            a.state = AgentState.PREFILL

    def _idle_step(self) -> StepRecord:
        """Every agent waits for a tool or a client: the clock runs to the first return (the sim's), or the
        engine waits a slice, less where work arrives (a request)."""
        ready = [a.tool_ready_at for a in self.agents if a.tool_ready_at is not None]
        note = "every agent waits for a tool" if ready else "every agent waits for its client"
        seconds = self.clock.idle(min(ready) if ready else None, self.workload.idle)
        return self._record("idle", [], seconds, 0, [], note=note)

    def _prefill_step(self, plan: Plan, preempted: list[int]) -> StepRecord:
        a = plan.agents[0]
        try:
            self._paste_due(a)  # a chunk right after what it kept (a removal) goes back before any prefill
            n = min(plan.chunk, a.kept[0].at - a.context) if a.kept else plan.chunk  # up to the next kept chunk
            chunk = a.pending[:n]
            seconds = self.backend.prefill(a.seq, chunk, a.context)
            a.history.extend(chunk)
            del a.pending[:n]
            self._paste_due(a)
        except NoKVSlot:
            self._preempt(a)
            return self._record("prefill", [], 0.0, 0, preempted + [a.id], note="no KV slot")
        a.last_served_step = self.step_index
        if not a.pending:
            a.state = AgentState.DECODE
            self._sampled(a, self.backend.first_token_after_prefill(a.seq), seconds)
        return self._record("prefill", [a], seconds, len(chunk), preempted)

    def _paste_due(self, a: Agent) -> None:
        """Kept chunks of its old cells whose place its prefill has reached go back (engine/chunk_reuse.py)."""
        while a.kept and a.kept[0].at == a.context:
            k = a.kept[0]
            seconds = self.backend.paste(a.seq, k.handle, k.at)
            a.kept.pop(0)
            a.history.extend(k.tokens)
            self.moves.add(a, "paste", int(self.facts.bytes_model.kv_cache_bytes(self.s.kv, a.context)), seconds,
                           a.context)

    def _sampled(self, a: Agent, tok: int, seconds: float) -> None:
        """A token just sampled for a (after its prefill or in a decode step): its turn goes on with it, or
        ends before it (an end of generation, the turn's limit, the context's, or its source says so)."""
        source = self.workload
        if not (self.backend.is_eog(tok) or a.turn_generated >= source.turn_limit(a) or a.context + 2 >= a.limit):
            a.next_token = tok
            if source.on_token(a, tok, self.backend.piece(tok)):
                return
        a.next_token = None
        source.end_turn(a, self.clock.after(seconds))
        if a.state is AgentState.TOOL:
            self.parking.park(a, self.agents)

    def _reference_due(self, batch: list[Agent]) -> bool:
        return self.s.reference and self.analysis.reference_due(self.s.kv, [a.context for a in batch],
                                                                 self._since_reference)

    def _decode_step(self, plan: Plan, preempted: list[int]) -> StepRecord:
        batch = plan.agents
        note = ""
        self._since_reference += 1
        if self._reference_due(batch):
            # one agent alone, the others wait a step: a real step of the run, timed at batch 1, by the
            # agent nearest the batch's mean context (where the next speedups will be read)
            mean_ctx = mean_context(a.context for a in batch)
            batch = [min(batch, key=lambda a: (abs(a.context - mean_ctx), a.last_served_step))]
            note = "batch-1 reference step"
        if len(batch) == 1:
            self._since_reference = 0
        while True:
            try:
                sent = [a.next_token for a in batch if a.next_token is not None]  # every agent batched has one
                out, seconds = self.backend.decode([a.seq for a in batch], sent, [a.context for a in batch])
                break
            except NoKVSlot:
                victim = max(batch, key=lambda a: a.context)
                self._preempt(victim)
                preempted.append(victim.id)
                batch = [a for a in batch if a is not victim]
                if not batch:
                    return self._record("decode", [], 0.0, 0, preempted, note="no KV slot")
        for a, fed, tok in zip(batch, sent, out, strict=True):
            a.history.append(fed)
            a.generated += 1
            a.turn_generated += 1
            a.last_served_step = self.step_index
            self._sampled(a, tok, seconds)
        rec = self._record("decode", batch, seconds, len(batch), preempted, note=note)
        rec.reference = bool(note)
        return rec

    def _rebuild(self, kv: str) -> StepRecord:
        old, asked = self.s.kv, kv
        for a in self.agents:
            a.fold_kept()  # cut from the old cache, in its type: prefilled instead
        t0 = time.perf_counter()
        refused = ""
        conv = convert_histories(self.backend, self.agents, old, kv, self.s.kv_convert, self.moves) \
            if kv != old else Converted()
        converted = conv.states
        try:
            self.backend.open(kv, self.slots, self.s.ctx_per_agent)
        except UserError as e:  # this build cannot make that cache: keep running on the old one
            refused = f"{kv} refused ({e}); "
            self.refused_kv.add(kv)  # the tuner does not ask for it again
            kv = old
            self.backend.open(kv, self.slots, self.s.ctx_per_agent)
            converted = conv.saved  # the states as saved go back into the old type's cache
            self.moves.forget("convert")
        self.s.kv = kv
        self._applied(Control(kv=asked))  # done, or refused: either way no longer pending
        self.analysis.context_opened()
        budget = self.budget_tokens(kv)
        back = restore_histories(self.backend, self.agents, converted, budget, self.scheduler.used_tokens)
        restored, restore_s, converted_tokens = back.ids, back.seconds, back.cached_tokens
        for a in self.agents:
            if a.state is AgentState.TOOL and a.residency is Residency.HOST and a.id not in restored and kv != old:
                a.evict()  # its saved rows are in the old cache's type: prefilled again when its tool returns
                self.moves.add(a, "swap_discarded", 0, 0.0)
        live = [a for a in self.agents if a.state is not AgentState.PREEMPTED and a.residency is Residency.CACHE
                and a.id not in restored]
        for a in self.agents:
            self.workload.seed_sampler(a)
            if a not in live:
                continue
            if not a.history and not a.pending:
                self.workload.start_task(a)  # an agent added beyond the old streams starts here
            a.requeue()
        total = sum(len(a.pending) for a in live)
        seconds, done = 0.0, 0
        preempted: list[int] = []
        self.backend.interrupt_with(self.should_stop)  # quitting stops even a chunk in progress
        try:
            for a in sorted(live, key=lambda x: x.id):
                if self.scheduler.used_tokens(self.agents) + len(a.pending) > budget:
                    if a.state is AgentState.TOOL:
                        a.evict()  # it waits for its tool; its history is prefilled on return
                    else:
                        a.state = AgentState.PREEMPTED  # the smaller budget cannot hold it; readmitted later
                    preempted.append(a.id)
                    continue
                while a.pending:
                    if self.should_stop():
                        raise Interrupted()
                    chunk = a.pending[: self.s.chunk_tokens]
                    seconds += self.backend.prefill(a.seq, chunk, a.context)
                    a.history.extend(chunk)
                    del a.pending[: len(chunk)]
                    done += len(chunk)
                    self.progress("rebuild", done, total)
                if a.state is not AgentState.TOOL:  # a waiting agent samples after its tool result
                    a.state = AgentState.DECODE
                    self._sampled(a, self.backend.first_token_after_prefill(a.seq), 0.0)
        finally:
            self.backend.interrupt_with(None)
        moves_s = self.moves.seconds("convert")
        # the conversion's own seconds are in its moves
        wall = self.clock.step_seconds(max(time.perf_counter() - t0 - moves_s, 0.0), seconds + restore_s)
        what = f"kv {old} -> {kv}" if kv != old or refused else f"room for {self.slots} agents"
        how = []
        if converted_tokens:
            how.append(f"converted {converted_tokens} cached tokens of {len(restored)} agents in place "
                       f"({moves_s + restore_s:.2f} s)")
        if done or not converted_tokens:
            how.append(f"re-prefilled {done} tokens" + (f" (no conversion: {conv.why_not})" if conv.why_not else ""))
        rec = self._record("rebuild", [], wall, done, preempted,
                           note=f"{refused}{what}: " + "; ".join(how) + f" in {wall + moves_s:.2f} s")
        rec.converted_tokens = converted_tokens
        return rec

    # the record
    def _record(self, kind: str, batch: list[Agent], seconds: float, tokens: int, preempted: list[int],
                note: str = "") -> StepRecord:
        moved = self.moves.take()
        t = self.clock.step_ended(seconds + sum(m.seconds for m in moved))
        rec = self.recorder.record(self.step_index, t, kind, batch, seconds, tokens, preempted, note, moved,
                                   self.agents, self.meter, self._step_t0)
        self.step_index += 1
        return rec

    def close(self) -> None:
        self.meter.close()
        if self.quality is not None and hasattr(self.quality, "close"):
            self.quality.close()  # its side contexts, before the model they run on
        self.backend.close()


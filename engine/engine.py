"""The engine: drives a swarm of agents through one backend, one step at a time, and says what each
step did. The caller owns the loop (record, dashboard, server); controls may arrive from any thread
and take effect at the start of the next step."""

import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime

from swarmtune.engine.agents.agent import Agent
from swarmtune.engine.agents.agent_source import AgentSource
from swarmtune.engine.agents.cache_check import check_caches
from swarmtune.engine.agents.roster import Roster
from swarmtune.engine.agents.workload import Workload
from swarmtune.engine.backends.backend import NO_DRAFTS_RECURRENT, Backend
from swarmtune.engine.backends.clock import Clock
from swarmtune.engine.batch_runner import BatchRunner, Ran
from swarmtune.engine.control import Control, ControlPath, EngineState, Pending
from swarmtune.engine.engine_view import EngineSnapshot, QualityHook, TunerHook
from swarmtune.engine.errors import UserError
from swarmtune.engine.kv.budget import KVBudget
from swarmtune.engine.kv.residency import MoveLog, Parking
from swarmtune.engine.kv.switch import KVSwitch
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.measure.analysis import StepAnalysis
from swarmtune.engine.measure.power.meter import Meter, NoMeter
from swarmtune.engine.measure.speedup import BatchOneReference
from swarmtune.engine.measure.step_model import Calibration
from swarmtune.engine.record.recorder import Recorder
from swarmtune.engine.record.records import StepRecord
from swarmtune.engine.record.run_header import run_header
from swarmtune.engine.scheduler import Scheduler
from swarmtune.engine.settings import (
    EngineSettings,
    cap_in_force,
    min_context,
)
from swarmtune.engine.tune.events import TuneEvent


class Engine:
    def __init__(self, backend: Backend, settings: EngineSettings,
                 progress: Callable[[str, int, int], None] | None = None, meter: Meter | None = None,
                 tuner: TunerHook | None = None, autotune: bool = False, agents: AgentSource | None = None,
                 quality: QualityHook | None = None) -> None:
        settings.validate(backend.facts.n_ctx_train, backend.allow_drafts(settings.draft_tokens))
        self.backend = backend
        self.facts = backend.facts
        # a prefill chunk never exceeds what one backend call may carry
        self.s = replace(settings, batch_cap=cap_in_force(settings.batch_cap, settings.agents),
                         chunk_tokens=min(settings.chunk_tokens, backend.max_chunk_tokens))
        self.progress = progress or (lambda what, done, total: None)
        # what drives the agents (engine/agents/agent_source.py): the synthetic swarm unless told otherwise
        self.workload: AgentSource = agents or Workload(backend, self.s.seed, self.s.gen_tokens, self.s.tool_tokens,
                                 self.s.tool_latency_s, self.s.tool_latency_sigma)
        self.roster = Roster(backend, self.workload, self.s.agents, self.s.ctx_per_agent)
        self.agents: list[Agent] = self.roster.agents
        self.budget = KVBudget(self.facts, self.s)
        # it reads the batch cap and the chunk from the settings, the budget from the KV type in force
        min_need = min_context(self.s)
        if self.budget_tokens(self.s.kv) < min_need:
            raise UserError(f"the KV budget holds {self.budget_tokens(self.s.kv)} tokens at {self.s.kv}; "
                            f"not even one agent fits (needs {min_need})")
        self.step_index = 0
        self.clock: Clock = backend.new_clock()  # the wall's, or a simulated card's modeled seconds
        # what was requested and not yet applied; the settings in force are self.s (and self.autotune)
        self.pending = Pending(self.s, self.budget_tokens, lambda: None if self.tuner is None else self.autotune,
                               self._why_no_room, NO_DRAFTS_RECURRENT if self.facts.bytes_model.state_bytes else None)
        self.tuner = tuner  # engine/tune/: watches every record, turns the controls through request()
        self.quality = quality  # engine/quality/quality_check.py: the live KV quality check, where there is one
        self.autotune = autotune and tuner is not None
        self.started = False
        self.started_at, self.run_id = "", ""
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
        self.runner = BatchRunner(backend, self.s, self.workload, self.clock, self.analysis, self.moves, self.parking)
        self.scheduler = Scheduler(self.s, lambda: self.budget_tokens(self.s.kv), self.runner.mix.chunk)
        self.switch = KVSwitch(backend, self.s, self.analysis, self.moves, self.runner)
        self.controls = ControlPath(self.s, self.pending, self.roster.resize, lambda: len(self.agents),
                                    self.runner.drafts.make_room, self._autotune)
        self._queued: list[StepRecord] = []  # the tuner's records, handed out before the next step
        # overlap: the next decode step is launched before a step's record goes to its readers, where the
        # backend's steps run on a device while the host goes on (docs/host.md)
        self.overlap = self.s.overlap if self.s.overlap is not None else backend.caps.launches_async
        self._landing: Callable[[], Ran] | None = None  # the step launched and not yet landed

    # setup
    def budget_tokens(self, kv: KVSetting) -> int:
        """The tokens of full-attention cache the KV budget holds at this type, over every agent."""
        return self.budget.tokens(kv, self.slots)

    def snapshot(self) -> EngineSnapshot:
        """What a shadow of this engine starts from (engine/tune/shadow.py): the live agents, to copy, not change."""
        return EngineSnapshot(slots=self.slots, kv=self.s.kv, ctx_per_agent=self.s.ctx_per_agent,
                              now_s=self.now_s(), step_index=self.step_index,
                              since_reference=self.runner.since_reference, agents=tuple(self.agents),
                              analysis=self.analysis)

    def resume_from(self, snap: EngineSnapshot, clock: Clock) -> None:
        """In place of start(): goes on from another's snapshot, on this clock (agents and cache: the caller's)."""
        self.roster.slots = snap.slots
        self.runner.since_reference = snap.since_reference
        self.clock = self.runner.clock = clock
        self.started = True
        self.step_index = snap.step_index

    @property
    def calibration(self) -> Calibration:
        return self.analysis.calibration(self.s.kv)

    @property
    def reference(self) -> BatchOneReference:
        return self.analysis.reference(self.s.kv)

    def start(self) -> None:
        t0 = time.perf_counter()
        self.backend.open(self.s.kv, self.slots, self.s.ctx_per_agent)
        self.analysis.context_opened(time.perf_counter() - t0)
        for i in range(self.s.agents):
            self.roster.add(i)
        self.clock.start()
        self.started_at, self.run_id = datetime.now(UTC).isoformat(timespec="seconds"), uuid.uuid4().hex[:12]
        self.started = True
        if self.autotune and self.tuner is not None:
            # on the run's clock: what the tuner measures before the first step costs the swarm its time
            self._queued += [self.tune_record(note) for note in self.tuner.prepare(self)]

    def _why_no_room(self, kv: KVSetting, agents: int) -> str | None:
        """Whether the device holds the cache this KV type and agent count would rebuild: refused at the
        request, not in the rebuild (where the old type would need the new streams too)."""
        return self.backend.why_no_room(kv, self.roster.slots_for(agents), self.s.ctx_per_agent)

    @property
    def slots(self) -> int:
        return self.roster.slots

    def header(self) -> dict[str, object]:
        return run_header(self.backend, self.s, self.slots, self.overlap, self.reference, self.meter,
                          self.started_at, self.run_id)

    # controls: validated now, in the caller's thread; applied at the next step
    def request(self, c: Control) -> EngineState:
        """Checked here, for every caller, in one wording; applied at the next step."""
        return self.pending.request(c)

    def set_workload(self, gen_tokens: int | None = None, tool_tokens: int | None = None,
                     tool_latency_s: float | None = None) -> None:
        """The synthetic swarm's turns change shape from the next turn on (a bench's phases: reading large
        tool results, then writing long answers): a forecast made after it sees the new shape."""
        if not isinstance(self.workload, Workload):
            raise UserError("only the synthetic swarm's turns can be reshaped")
        self.controls.reshape(gen_tokens, tool_tokens, tool_latency_s)
        self.workload.reshape(gen_tokens, tool_tokens, tool_latency_s)

    def state(self) -> EngineState:
        """The settings in force with the change requested and not yet applied over them."""
        return self.pending.state()

    def _apply_controls(self) -> Ran | None:
        """What was requested, applied (engine/control.py); a new KV type, or more streams or drafted rows
        than the context was made for, rebuild it: a step of its own."""
        rebuild_to, more_rows = self.controls.apply()
        if rebuild_to is None and self.backend.n_seqs >= self.slots and not more_rows:
            return None
        ran = self.switch.rebuild(rebuild_to or self.s.kv, self.slots, self.agents, self.budget_tokens,
                                  self.scheduler.used_tokens, self.should_stop, self.progress)
        if rebuild_to is not None:
            self.pending.applied(Control(kv=rebuild_to))  # done, or refused: either way no longer pending
        return ran

    def _autotune(self, on: bool) -> None:
        if on != self.autotune:
            self.autotune = on
            if on and self.tuner is not None:
                self.tuner.restart()  # it measures from now, not from before it was turned off

    # one step
    def step(self) -> StepRecord:
        if self._queued:
            return self._queued.pop(0)
        if not self.started:
            self.start()
            if self._queued:
                return self._queued.pop(0)
        rec = self._land() if self._landing is not None else self._step()
        self._observe(rec)
        if self.overlap and not self._queued and not self.should_yield():
            self._launch_next()
        return rec

    def _observe(self, rec: StepRecord) -> None:
        """A step's hooks: its agents' source, the cache check, the quality check, the tuner."""
        self.workload.on_record(rec)
        if self.s.check:
            check_caches(self.backend, self.agents)
        if self.quality is not None:  # before the tuner: what it measures, the tuner reads at once
            for note in self.quality.observe(self, rec):
                self._queued.append(self.tune_record(note))
        if self.autotune and self.tuner is not None:
            for note in self.tuner.observe(self, rec):
                self._queued.append(self.tune_record(note))

    def land(self) -> None:
        """The step launched ahead (overlap), if any, lands now and its hooks run; its record is what the
        next step() returns. For a caller about to read the caches between steps: a launched step has
        written its cells and not yet handed its tokens to their agents."""
        if self._landing is not None:
            rec = self._land()
            self._observe(rec)
            self._queued.insert(0, rec)

    @property
    def in_flight(self) -> bool:
        """A step was launched and has not landed: the next step() lands it (a pause waits for that)."""
        return self._landing is not None

    def _launch_next(self) -> None:
        """The next step begun now, after this one's hooks (what they change, it sees, as without overlap)
        and before its record is written and published, which then runs while the device computes. A
        control or a rebuild is a step of its own: left to the next step(), run in full."""
        if self.pending.take() or self.backend.n_seqs < self.slots:
            return
        self._step_t0 = time.perf_counter()
        if (switched := self._apply_controls()) is None:  # none pending: the cap kept in force, nothing rebuilt
            self._landing = self._begin(launch=True)
            return
        # a control came between the check above and this apply: its rebuild ran, and its record is the next
        rec = self._record(switched)
        self._observe(rec)
        self._queued.append(rec)

    def _land(self) -> StepRecord:
        landing, self._landing = self._landing, None
        assert landing is not None
        return self._record(landing())

    def tune_record(self, tune: TuneEvent) -> StepRecord:
        """A tuner's decision (or its measured outcome) as a record of its own, kind "tune"."""
        rec = self.recorder.tune_record(self.step_index, self.now_s(), self.agents, tune)
        self.step_index += 1
        return rec

    def now_s(self) -> float:
        """The engine's clock: simulated seconds on the sim backend, wall seconds since start otherwise."""
        return self.clock.now_s()

    def check_caches(self) -> None:
        """Raises CacheMismatch where an agent's cells are not exactly its history (engine/agents/cache_check.py);
        a step launched ahead lands first."""
        self.land()
        check_caches(self.backend, self.agents)

    def _step(self) -> StepRecord:
        """Apply the pending control (a KV switch is a step of its own), let the agents' source act, wake the
        agents whose tools returned, schedule, run the plan on the backend, record."""
        self._step_t0 = time.perf_counter()
        if (switched := self._apply_controls()) is not None:
            return self._record(switched)
        return self._record(self._begin(launch=False)())

    def _begin(self, launch: bool) -> Callable[[], Ran]:
        self.workload.before_step(self.agents, self.now_s())  # requests that arrived go to their agents here
        if (shape := self.workload.traffic()) is not None:  # served traffic: the forecasts run what it looks like
            self.controls.reshape(shape.gen_tokens, shape.tool_tokens, shape.wait_s)
        self.runner.wake_tools(self.agents, self.now_s(),
                               lambda: self.budget_tokens(self.s.kv) - self.scheduler.used_tokens(self.agents))
        plan = self.scheduler.schedule(self.agents, self.step_index)
        return self.runner.start(plan, self.agents, self.step_index, launch)

    # the record
    def _record(self, ran: Ran) -> StepRecord:
        moved = self.moves.take()
        t = self.clock.step_ended(ran.seconds + sum(m.seconds for m in moved))
        rec = self.recorder.record(self.step_index, t, ran, moved, self.moves.take_lost(), self.agents, self.meter,
                                   self._step_t0)
        self.step_index += 1
        return rec

    def close(self) -> None:
        if self._landing is not None:  # the device's step ends before its context does
            self._landing()
            self._landing = None
        self.meter.close()
        if self.quality is not None and hasattr(self.quality, "close"):
            self.quality.close()  # its side contexts, before the model they run on
        self.runner.drafts.close()
        self.backend.close()


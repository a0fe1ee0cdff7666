"""What the engine shows the tuner and the live quality check, and what it asks of them. They see it through
`EngineView`, read-only (its members are properties and queries: mypy refuses an assignment to any of them),
and change it only by `request`, as a person at the dashboard would; a shadow for a forecast starts from its
`snapshot`."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from swarmtune.engine.agents.agent import Agent
from swarmtune.engine.backends.backend import Backend
from swarmtune.engine.control import Control, EngineState
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.measure.analysis import StepAnalysis
from swarmtune.engine.measure.power.meter import Meter
from swarmtune.engine.model.model_facts import ModelFacts
from swarmtune.engine.record.records import StepRecord
from swarmtune.engine.settings import EngineSettings
from swarmtune.engine.tune.events import TuneEvent


@dataclass(frozen=True)
class EngineSnapshot:
    """An engine's state as a shadow needs it to run on from here (Engine.snapshot)."""
    slots: int
    kv: KVSetting
    ctx_per_agent: int
    now_s: float
    step_index: int
    since_reference: int  # decode steps since the last batch-1 reference step
    agents: tuple[Agent, ...]
    analysis: StepAnalysis


class EngineView(Protocol):
    @property
    def agents(self) -> Sequence[Agent]: ...  # their contexts, states and histories

    @property
    def s(self) -> EngineSettings: ...  # the settings in force (the KV type, the budget, the turns' shape)

    @property
    def backend(self) -> Backend: ...  # its source (measured or simulated); the probes' side caches

    @property
    def facts(self) -> ModelFacts: ...

    @property
    def analysis(self) -> StepAnalysis: ...  # the step-time fits, per KV type

    @property
    def meter(self) -> Meter: ...

    @property
    def quality(self) -> "QualityHook | None": ...  # the live quality check, whose ledger a budget reads

    def now_s(self) -> float: ...

    def state(self) -> EngineState: ...  # the settings in force with what is requested over them

    def budget_tokens(self, kv: KVSetting) -> int: ...

    def should_yield(self) -> bool: ...  # a pause wants the engine's thread: a long look gives way

    def snapshot(self) -> EngineSnapshot: ...

    def request(self, c: Control) -> EngineState: ...  # the one change it may make


class TunerHook(Protocol):
    """What the engine asks of a tuner (engine/tune/): it sees every record and turns the controls only
    through `request`, as a person would."""

    def prepare(self, engine: EngineView) -> list[TuneEvent]: ...

    def observe(self, engine: EngineView, rec: StepRecord) -> list[TuneEvent]: ...

    def restart(self) -> None: ...


class QualityHook(Protocol):
    """The live KV quality check (engine/quality/quality_check.py): sees every record, now and then measures."""

    def observe(self, engine: EngineView, rec: StepRecord) -> list[TuneEvent]: ...

"""What the tuner says, as a `tune` record carries it: a decision, its measured outcome, the closed loop's
verdict on a change, a KV type timed in a side cache. Each is a dataclass that serialises to the JSON the
records have always held (`to_json`) and reads back from it (`event_from_json`), so every recording still
replays. Here, below the records, because a record holds one; the tuner (engine/tune/) makes them."""

from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar

from swarmtune.engine.kv.types import KVSetting


@dataclass(frozen=True)
class Setting:
    """What the tuner moves: one point of batch cap x KV type x residency."""

    batch_cap: int
    kv: KVSetting
    residency: str

    def label(self) -> str:
        return f"cap {self.batch_cap}, KV {self.kv}, {self.residency}"

    def as_dict(self) -> dict[str, Any]:
        return {"batch_cap": self.batch_cap, "kv": self.kv.label, "residency": self.residency}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Setting":
        return cls(int(d["batch_cap"]), KVSetting.parse(str(d["kv"])), str(d["residency"]))


@dataclass
class TuneEvent:
    """One thing the tuner said. Subclasses name their phase and list their fields in the JSON's order;
    `from_` is the JSON's "from"; the fields in `omit_none` are left out of the JSON where None (they belong
    to one path of several)."""

    phase: ClassVar[str] = ""
    omit_none: ClassVar[frozenset[str]] = frozenset()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"phase": self.phase}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None and f.name in self.omit_none:
                continue
            out[f.name.rstrip("_")] = (v.as_dict() if isinstance(v, Setting) else v.label if isinstance(v, KVSetting)
                                       else v)
        return out

    @property
    def why_text(self) -> str:
        return str(getattr(self, "why", ""))


def _settings(d: dict[str, Any]) -> dict[str, Any]:
    """A record's JSON with its settings as Settings and "from" as from_."""
    out = {("from_" if k == "from" else k): v for k, v in d.items() if k != "phase"}
    for k in ("from_", "to", "weighing"):
        if isinstance(out.get(k), dict):
            out[k] = Setting.from_dict(out[k])
    if isinstance(out.get("kv"), str):  # a quality check's setting
        out["kv"] = KVSetting.parse(out["kv"])
    return out


@dataclass
class Decision(TuneEvent):
    """A change the tuner made (or a trial of a KV type), on a forecast (modeled)."""

    phase: ClassVar[str] = "decided"
    omit_none: ClassVar[frozenset[str]] = frozenset({"kv_step_time_source"})
    from_: Setting
    to: Setting
    objective: str
    predicted_gain: float
    predicted_gain_source: str
    trial: bool
    forecast_spread: float | None
    horizon_s: float
    mean_context: float
    forecast_error: float
    forecast_error_source: str
    kv_step_time_source: str | None
    why: str


@dataclass
class Outcome(TuneEvent):
    """A decision's outcome over the longest span that passed: the measured objective against the forecast
    of staying, judged against the error stated for that span (`verdict`)."""

    phase: ClassVar[str] = "measured"
    from_: Setting
    to: Setting
    objective: str
    predicted_gain: float
    span_s: float
    predicted_gain_span: float | None
    forecast_spread: float | None
    measured_gain: float | None
    stated_error: float | None
    agrees: bool | None
    verdict: str | None
    measured_gain_source: str
    stated_error_source: str
    forecast_error: float | None
    why: str


@dataclass
class Held(TuneEvent):
    """The closed loop's verdict on a change: neither measurably better nor worse, left to the forecasts."""

    phase: ClassVar[str] = "held"
    to: Setting
    q: float | None
    measured_gain: float
    why: str


@dataclass
class Confirmed(TuneEvent):
    """The closed loop's verdict on a change: measurably no worse than staying."""

    phase: ClassVar[str] = "confirmed"
    to: Setting
    q: float | None
    trial: bool
    measured_gain: float | None
    why: str


@dataclass
class Reverted(TuneEvent):
    """A change measurably worse than staying, undone: on its steps against the forecast's step-time model
    (q, q_stderr, decode_steps, trial), or on the objective against the forecast of staying (stated_error)."""

    phase: ClassVar[str] = "reverted"
    omit_none: ClassVar[frozenset[str]] = frozenset({"q", "q_stderr", "decode_steps", "trial", "stated_error"})
    from_: Setting
    to: Setting
    measured_gain: float | None
    mean_context: float
    source: str
    why: str
    q: float | None = None
    q_stderr: float | None = None
    decode_steps: int | None = None
    trial: bool | None = None
    stated_error: float | None = None


@dataclass
class RevertRefused(TuneEvent):
    """A change it meant to undo, which the swarm no longer allowed (agents removed meanwhile)."""

    phase: ClassVar[str] = "revert_refused"
    to: Setting
    why: str


@dataclass
class Probed(TuneEvent):
    """A KV type timed against the run's own in a side cache (engine/measure/kv_probe.py): its figures (measured),
    or why it could not be timed."""

    phase: ClassVar[str] = "probed"
    kv: KVSetting
    base_kv: KVSetting
    why: str
    error: str | None = None
    figures: dict[str, Any] = field(default_factory=dict)  # the probe's own record, flat in the JSON

    def to_json(self) -> dict[str, Any]:
        if self.error is not None:
            return {"phase": self.phase, "kv": self.kv.label, "base_kv": self.base_kv.label, "error": self.error,
                    "why": self.why}
        return {"phase": self.phase, "kv": self.kv.label, "base_kv": self.base_kv.label, **self.figures,
                "why": self.why}


@dataclass
class Trial(TuneEvent):
    """An experiment begun: the candidate and the incumbent take turns on the swarm (engine/tune/experiment.py);
    why it was proposed (a forecast, modeled), and what it must clear to be kept."""

    phase: ClassVar[str] = "trial"
    from_: Setting
    to: Setting
    objective: str
    forecast_gain: float | None
    forecast_gain_source: str
    forecast_error: float
    forecast_error_source: str
    exploratory: bool  # proposed within the forecast's error: spent from the exploration budget
    block_s: float
    max_pairs: int
    bar: float  # the measured gain it must clear to be kept (what going over costs over what is left)
    mean_context: float
    why: str
    # an exploration: what explorations had taken before it (engine seconds of their blocks), the least it
    # takes (its least pairs, and as long again to reap), and the run's budget for them
    explored_s: float | None = None
    explore_least_s: float | None = None
    explore_budget_s: float | None = None


@dataclass
class Experimented(TuneEvent):
    """An experiment's end (engine/tune/experiment.py). Measured on the swarm, in interleaved pairs of blocks,
    each with its one-sided 95% bounds from the pairs' own spread: the objective's gain of the candidate
    over the incumbent (`objective_*`), and its decode and prefill step times against the model relative
    to the incumbent's (`decode_factor*`, `prefill_factor`). Modeled on those step times: the gain over
    the rest of the horizon (`corrected_*`). What it did (kept, rejected, gave up at its budget, ended
    with the run, abandoned when the setting was moved under it); whether the forecast that proposed it
    agrees (its step times within the measured bounds, or its gain within the objective's); its cost."""

    phase: ClassVar[str] = "experiment"
    from_: Setting
    to: Setting
    objective: str
    result: str  # kept | rejected | gave up | ended | abandoned
    pairs: int
    objective_gain: float | None
    objective_low: float | None
    objective_high: float | None
    decode_factor: float | None
    decode_factor_low: float | None
    decode_factor_high: float | None
    prefill_factor: float | None
    corrected_gain: float | None
    corrected_low: float | None
    corrected_high: float | None
    confidence: float
    forecast_gain: float | None
    verdict: str | None  # agrees | disagrees | None (fewer pairs than a verdict needs)
    seconds_incumbent: float
    seconds_candidate: float
    switches: int
    switch_s: float
    switch_cells: int
    tokens_lost: float
    source: str
    why: str


@dataclass
class Spent(TuneEvent):
    """What the tuner has spent so far this run (engine/tune/cost.py)."""

    phase: ClassVar[str] = "cost"
    think_s: float
    think_cpu_s: float
    forecasts: int
    looks: int
    looks_skipped: int
    probe_s: float
    switches: int
    switch_s: float
    switch_cells: int
    experiments: int
    experiment_s: float
    tokens_lost: float
    why: str
    looks_waived: int = 0  # epochs without a look: the one before found nothing within reach


@dataclass
class QualityChecked(TuneEvent):
    """A live KV quality check (engine/quality/quality_check.py): one agent's last positions through a setting
    against f16/f16, and the setting's figures at that context band so far (measured)."""

    phase: ClassVar[str] = "quality"
    kv: KVSetting
    band: list[int]  # the context band [low, high) the figures stand for
    positions: int  # behind the band's figures, this check's included
    mean_kl: float | None  # nats per token; None below MIN_POSITIONS positions
    p99_kl: float | None
    top1_same: float | None
    check_kl: float  # this check's own positions' mean KL
    agent: int
    context: int
    check_s: float  # this check's wall seconds (measured)
    spent_s: float  # every check's, so far
    why: str
    source: str = "measured: teacher-forced against an f16/f16 side context"


@dataclass
class Foreseen(TuneEvent):
    """The KV budget's outlook at a look (engine/tune/budget_outlook.py): when it binds at the setting in force
    (the place the byte model's, exact; the time a forecast from the resident histories' measured growth),
    what staying will re-prefill, and each way out weighed against it over the forecast's horizon (modeled),
    with its quality where the live check measured it; `weighing`: the one the tuner tries; `ruled_out`: what
    the quality budget excludes."""

    phase: ClassVar[str] = "budget"
    omit_none: ClassVar[frozenset[str]] = frozenset({"weighing", "ruled_out", "binds_in_s", "growth_tokens_per_s"})
    kv: KVSetting
    budget_tokens: int
    resident_tokens: int
    full_at_context: float
    growth_tokens_per_s: float | None
    binds_in_s: float | None
    horizon_s: float
    staying_reprefilled: int
    # per way out: {"to": a setting, "gain": the objective's over staying, "reprefilled": tokens, "mean_kl"}
    ways: list[dict[str, Any]]
    why: str
    weighing: Setting | None = None
    ruled_out: str | None = None
    source: str = "budget and bytes per token exact; growth measured; gains and re-prefills forecast (modeled)"


@dataclass
class Speculated(TuneEvent):
    """A speculation experiment's end (engine/tune/draft_trial.py): under --draft auto, the measured rule's
    drafts against none in interleaved pairs of blocks of decode steps; the gain in decode tokens per second
    with its two-sided 95% bounds (measured), the drafted and kept tokens, what it did (kept, off, gave up,
    ended with the run, abandoned when a person set a length), its blocks' seconds and the tokens the
    candidate's blocks cost against the incumbent's rate."""

    phase: ClassVar[str] = "speculation"
    result: str  # kept | off | gave up | ended | abandoned
    pairs: int
    gain: float | None
    low: float | None
    high: float | None
    drafted: int
    accepted: int
    seconds_drafts: float
    seconds_none: float
    tokens_lost: float
    why: str
    source: str = "measured"


EVENTS: dict[str, type[TuneEvent]] = {c.phase: c for c in (Decision, Outcome, Held, Confirmed, Reverted,
                                                            RevertRefused, Probed, Trial, Experimented, Spent,
                                                            QualityChecked, Foreseen, Speculated)}


def event_from_json(d: dict[str, Any]) -> TuneEvent:
    """A `tune` record's JSON as its event; a recording's unknown keys are kept where the event has room."""
    phase = d.get("phase")
    if phase == "probed":
        known = {"phase", "kv", "base_kv", "why", "error"}
        return Probed(kv=KVSetting.parse(str(d.get("kv"))), base_kv=KVSetting.parse(str(d.get("base_kv"))),
                      why=str(d.get("why", "")),
                      error=d.get("error"), figures={k: v for k, v in d.items() if k not in known})
    cls = EVENTS.get(str(phase))
    if cls is None:
        raise ValueError(f"unknown tune phase {phase!r}")
    names = {f.name for f in fields(cls)}
    kw = {k: v for k, v in _settings(d).items() if k in names}
    for f in fields(cls):
        # left out of the JSON where None, or a key an older recording did not hold yet
        if f.name not in kw:
            kw[f.name] = (f.default if f.default is not MISSING else
                          f.default_factory() if f.default_factory is not MISSING else None)
    return cls(**kw)

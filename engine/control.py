"""A change of settings, wherever it comes from: a flag, a key, a typed command, an HTTP body, the tuner.
Each field left None is left as it is. A new control is a field here, one check in `Pending.request`, and
its name over HTTP where that differs. Requested from any thread, it waits (`Pending`) until the engine's
next step applies it."""

import threading
from collections.abc import Callable
from dataclasses import dataclass, fields, replace

from swarmtune.engine.errors import UserError
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.settings import (
    DraftSetting,
    EngineSettings,
    cap_in_force,
    check_agents,
    check_batch_cap,
    check_residency,
    min_context,
    whole_number,
)

# the HTTP API's names where they differ from the engine's (`kv_type` reads better beside `batch_cap` in a body)
HTTP_NAMES = {"kv": "kv_type"}


@dataclass(frozen=True)
class Control:
    batch_cap: int | None = None
    kv: KVSetting | None = None
    agents: int | None = None
    residency: str | None = None
    autotune: bool | None = None
    draft: DraftSetting | None = None  # speculation: a whole number 0-16 or "auto" given, read as the setting

    def __post_init__(self) -> None:
        """Whoever embeds the engine builds controls in Python: each field is read or refused here, at the
        call, in one line (a KV setting may be given as its spelling, "q8_0" or "q8_0/f16"). Unchecked,
        a string where a setting belongs passed the call and failed later on the engine's thread."""
        if isinstance(self.kv, str):
            object.__setattr__(self, "kv", KVSetting.parse(self.kv))
        elif self.kv is not None and not isinstance(self.kv, KVSetting):
            raise UserError(f"kv must be a KV setting or its spelling, such as 'q8_0' (got {self.kv!r})",
                            field="kv_type")
        for name in ("batch_cap", "agents"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                raise UserError(f"{name.replace('_', ' ')} must be a whole number (got {v!r})", field=name)
        if self.residency is not None and not isinstance(self.residency, str):
            raise UserError(f"residency must be one of keep, swap, drop (got {self.residency!r})", field="residency")
        if self.autotune is not None and not isinstance(self.autotune, bool):
            raise UserError(f"autotune must be true or false (got {self.autotune!r})", field="autotune")
        if self.draft is not None and not isinstance(self.draft, DraftSetting):
            object.__setattr__(self, "draft", DraftSetting.parse(self.draft))

    def changes(self) -> dict[str, object]:
        """What it changes, by the engine's names."""
        # read on every step (the engine's state is its settings with a pending change over them): not
        # asdict, whose deep copies were a fifth of a simulated forecast's time
        return {f.name: v for f in _FIELDS if (v := getattr(self, f.name)) is not None}

    def __bool__(self) -> bool:
        # read on every step, mostly of an empty change
        return any(getattr(self, f.name) is not None for f in _FIELDS)

    def then(self, later: "Control") -> "Control":
        """This change and a later one, as one: where both set a field, the later's value."""
        return replace(self, **later.changes())  # type: ignore[arg-type]

    def less(self, done: "Control") -> "Control":
        """What is left of this change once `done` took effect: each field done set to the same value goes."""
        gone = done.changes()
        return Control(**{k: v for k, v in self.changes().items() if gone.get(k, None) != v})  # type: ignore[arg-type]

    def to_http(self) -> dict[str, object]:
        return {HTTP_NAMES.get(k, k): _http_value(v) for k, v in self.changes().items()}

    @classmethod
    def from_http(cls, body: dict[str, object]) -> "Control":
        """From a body already validated field by field (the server's model): the engine's names back, and
        the KV setting read from its spelling (a bad one is a UserError, field kv_type)."""
        back = {v: k for k, v in HTTP_NAMES.items()}
        names = {f.name for f in fields(cls)}
        kw = {back.get(k, k): v for k, v in body.items() if back.get(k, k) in names}
        if isinstance(kw.get("kv"), str):
            kw["kv"] = KVSetting.parse(str(kw["kv"]))
        return cls(**kw)  # type: ignore[arg-type]


_FIELDS = fields(Control)  # once: dataclasses.fields() builds its tuple on every call


def _http_value(v: object) -> object:
    """A setting as a body spells it: a KV setting by its name, a draft setting as its number or "auto"."""
    if isinstance(v, KVSetting):
        return str(v)
    if isinstance(v, DraftSetting):
        return v.label if v.auto else v.tokens
    return v


@dataclass
class EngineState:
    """What a control answer reports: the settings now in force (or about to be, at the next step). Derived
    each time from the engine's settings and the change still pending (`Pending.state`), never kept."""
    batch_cap: int
    kv: KVSetting | None  # None: a source that does not know (a replay before its first step, an attached engine)
    agents: int
    residency: str = "keep"
    autotune: bool | None = None  # None: this engine has no tuner
    draft: DraftSetting | None = None  # None: a source that does not say

    @property
    def kv_label(self) -> str:
        """The KV setting as spelled ("q8_0", "q8_0/f16"); "unknown" where the source does not say."""
        return "unknown" if self.kv is None else self.kv.label


class Pending:
    """What was requested and not yet applied, as one change (a later request's fields win), checked for
    every caller in one wording. The settings in force are the engine's; state() is this change over them.
    A change stays pending while the engine applies it, so state() reads the same all along."""

    def __init__(self, settings: EngineSettings, budget_tokens: Callable[[KVSetting], int],
                 autotune: Callable[[], bool | None],
                 room: Callable[[KVSetting, int], str | None] | None = None, no_drafts: str | None = None) -> None:
        self.s = settings  # the engine's own
        self._budget_tokens = budget_tokens  # what the KV budget holds at a type
        self._autotune = autotune  # the tuner's switch in force; None: no tuner
        # whether the device holds the cache a KV type and an agent count would rebuild (None: it fits)
        self._room = room
        self._no_drafts = no_drafts  # why this model cannot verify drafts (None: it can)
        self._change = Control()
        self._lock = threading.Lock()

    def request(self, c: Control) -> EngineState:
        batch_cap, kv, agents, residency, autotune = c.batch_cap, c.kv, c.agents, c.residency, c.autotune
        with self._lock:
            if autotune is not None and self._autotune() is None:
                raise UserError("this engine has no tuner", field="autotune")
            st = self._state()
            n_agents = check_agents(agents) if agents is not None else st.agents
            if batch_cap is not None:
                check_batch_cap(batch_cap, n_agents)
            if kv is not None:
                if self.s.kv_budget_bytes is not None:
                    budget = self._budget_tokens(kv)
                    if budget < min_context(self.s):
                        raise UserError(f"the KV budget holds only {budget} tokens at {kv}", field="kv_type")
            if residency is not None:
                check_residency(residency)
            if c.draft is not None and c.draft.tokens and self._no_drafts:
                raise UserError(f"draft {c.draft.label}: no speculation on this model: {self._no_drafts}",
                                field="draft")
            if self._room is not None and (kv is not None or agents is not None) and st.kv is not None:
                why = self._room(kv if kv is not None else st.kv, n_agents)
                if why is not None:
                    raise UserError(why, field="kv_type" if kv is not None else "agents")
            self._change = self._change.then(c)
            return self._state()

    def state(self) -> EngineState:
        """The settings in force with the change requested and not yet applied over them: what the next step
        runs with (a KV type being rebuilt to included)."""
        with self._lock:
            return self._state()

    def _state(self) -> EngineState:
        p, s = self._change, self.s
        agents = p.agents if p.agents is not None else s.agents
        tuner_on = self._autotune()
        return EngineState(
            batch_cap=cap_in_force(p.batch_cap if p.batch_cap is not None else s.batch_cap, agents),
            kv=p.kv or s.kv,
            agents=agents,
            residency=p.residency or s.residency,
            autotune=None if tuner_on is None else (p.autotune if p.autotune is not None else tuner_on),
            draft=p.draft or DraftSetting(s.draft_tokens, s.draft_auto),
        )

    def take(self) -> Control:
        """The change to apply now (it stays pending until `applied`)."""
        with self._lock:
            return self._change

    def applied(self, done: Control) -> None:
        """done has taken effect: what is left pending is what was requested since (or differently)."""
        with self._lock:
            self._change = self._change.less(done)


COMMAND_HELP = "kv TYPE (or K/V: q8_0/f16), cap N, agents N, residency keep|swap|drop, autotune on|off or draft N|auto"


def parse_command(text: str) -> Control:
    """A typed command (the dashboards' `:` box) as a change; its values are checked where every control's
    are (`Engine.request`, or a remote node's `/v1/control`), so that a bad one reads the same line. A KV
    setting is read here, where its spelling enters, in the words every other entry uses."""
    parts = text.split()
    if len(parts) != 2 or parts[0] not in ("kv", "cap", "agents", "residency", "autotune", "draft"):
        raise UserError(f"unknown command {text.strip()!r}: use {COMMAND_HELP}")
    what, value = parts
    if what == "kv":
        return Control(kv=KVSetting.parse(value))
    if what == "residency":
        return Control(residency=value)
    if what == "draft":
        return Control(draft=DraftSetting.parse(value))
    if what == "autotune":
        if value not in ("on", "off"):
            raise UserError(f"autotune takes on or off (got {value!r})")
        return Control(autotune=value == "on")
    n = whole_number(what, value)
    return Control(batch_cap=n) if what == "cap" else Control(agents=n)


class ControlPath:
    """The one writer of the settings in force (the KV type aside: the rebuild to it sets it once it is made).
    At the start of a step it applies what was requested; the workload's shape changes through it too. Every
    other module reads the settings."""

    def __init__(self, settings: EngineSettings, pending: Pending, resize: Callable[[int], None],
                 agents: Callable[[], int], make_room: Callable[[int], bool],
                 on_autotune: Callable[[bool], None]) -> None:
        self.s, self.pending = settings, pending
        self.resize = resize  # the roster to n agents (engine/agents/roster.py)
        self.agents = agents  # how many there are
        self.make_room = make_room  # contexts for n drafted rows; True where the live one must be made again
        self.on_autotune = on_autotune  # the tuner turned on or off

    def apply(self) -> tuple[KVSetting | None, bool]:
        """What was requested, applied but for a new KV type: that type (None: the one in force stays), and
        whether the context must be made again for more drafted rows. A request from another thread meanwhile
        is kept for the next step; a new KV type stays pending until its rebuild ends (or is refused)."""
        c = self.pending.take()
        if c.agents is not None:
            self.resize(c.agents)
            self.s.agents = c.agents
        if c.batch_cap is not None:
            self.s.batch_cap = c.batch_cap
        if c.residency is not None:
            self.s.residency = c.residency  # where the next agent to call a tool parks its history
        if c.draft is not None:
            self.s.draft_tokens, self.s.draft_auto = c.draft.tokens, c.draft.auto
        if c.autotune is not None:
            self.on_autotune(c.autotune)
        self.s.batch_cap = cap_in_force(self.s.batch_cap, self.agents())
        rebuild_to = c.kv if c.kv is not None and c.kv != self.s.kv else None
        if c:
            self.pending.applied(replace(c, kv=None) if rebuild_to is not None else c)
        return rebuild_to, self.make_room(self.s.draft_tokens)

    def reshape(self, gen_tokens: int | None = None, tool_tokens: int | None = None,
                tool_latency_s: float | None = None) -> None:
        """The workload's turns as the forecasts run them: a bench's phases, or what served traffic looks like."""
        for name, value in (("gen_tokens", gen_tokens), ("tool_tokens", tool_tokens),
                            ("tool_latency_s", tool_latency_s)):
            if value is not None:
                setattr(self.s, name, value)

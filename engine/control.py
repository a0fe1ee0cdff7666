"""A change of settings, wherever it comes from: a flag, a key, a typed command, an HTTP body, the tuner.
Each field left None is left as it is. A new control is a field here, one check in `Engine.request`, and
its name over HTTP where that differs."""

from dataclasses import dataclass, fields, replace

from swarmtune.engine.errors import UserError
from swarmtune.engine.settings import whole_number

# the HTTP API's names where they differ from the engine's (`kv_type` reads better beside `batch_cap` in a body)
HTTP_NAMES = {"kv": "kv_type"}


@dataclass(frozen=True)
class Control:
    batch_cap: int | None = None
    kv: str | None = None
    agents: int | None = None
    residency: str | None = None
    autotune: bool | None = None

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
        return {HTTP_NAMES.get(k, k): v for k, v in self.changes().items()}

    @classmethod
    def from_http(cls, body: dict[str, object]) -> "Control":
        """From a body already validated field by field (the server's model): the engine's names back."""
        back = {v: k for k, v in HTTP_NAMES.items()}
        names = {f.name for f in fields(cls)}
        return cls(**{back.get(k, k): v for k, v in body.items() if back.get(k, k) in names})  # type: ignore[arg-type]


_FIELDS = fields(Control)  # once: dataclasses.fields() builds its tuple on every call


COMMAND_HELP = "kv TYPE (or K/V: q8_0/f16), cap N, agents N, residency keep|swap|drop or autotune on|off"


def parse_command(text: str) -> Control:
    """A typed command (the dashboards' `:` box) as a change; its values are checked where every control's
    are (`Engine.request`, or a remote node's `/v1/control`), so that a bad one reads the same line."""
    parts = text.split()
    if len(parts) != 2 or parts[0] not in ("kv", "cap", "agents", "residency", "autotune"):
        raise UserError(f"unknown command {text.strip()!r}: use {COMMAND_HELP}")
    what, value = parts
    if what == "kv":
        return Control(kv=value)
    if what == "residency":
        return Control(residency=value)
    if what == "autotune":
        if value not in ("on", "off"):
            raise UserError(f"autotune takes on or off (got {value!r})")
        return Control(autotune=value == "on")
    n = whole_number(what, value)
    return Control(batch_cap=n) if what == "cap" else Control(agents=n)

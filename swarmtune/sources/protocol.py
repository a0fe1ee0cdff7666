"""What every source offers its consumer (the dashboard, `record`, `serve`): a header, a stream of step
records handed to a sink from the source's own thread, controls where it has them, and what it can do."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from swarmtune.engine.control import Control, EngineState
from swarmtune.engine.record.records import StepRecord


@dataclass(frozen=True)
class Capabilities:
    controls: bool  # batch cap, KV type and agents can be changed; False: read-only
    pause: bool  # can be paused
    seek: bool  # single step, seek and speed (a recording)


def _ignore(*args: object) -> None:
    return None


@dataclass
class Sink:
    """Where a running source hands what it produces; each callback is called from the source's thread."""
    records: Callable[[list[StepRecord]], None]
    header: Callable[[dict[str, Any]], None] = _ignore
    progress: Callable[[str, int, int], None] = _ignore  # what (e.g. "rebuild"), done, total
    seeked: Callable[[list[StepRecord]], None] = _ignore  # a seek: every record before the new position
    notice: Callable[[str], None] = _ignore  # a line for the person watching (a control refused late)
    every_s: float = 0.0  # hand records over in batches at most this often (0: each at once)


class Source(Protocol):
    mode: str  # for the status line: "", SIMULATED, REPLAY, REMOTE, READ-ONLY <engine>
    capabilities: Capabilities
    paused: bool

    @property
    def status(self) -> str:
        """The source's own state in a line ("" when all is well): a link retrying, a replay's position."""

    def header(self) -> dict[str, Any]: ...

    def state(self) -> EngineState: ...

    def request(self, c: Control) -> EngineState:
        """Change settings; raises UserError (one line) when the value or the source refuses it."""

    def run(self, sink: Sink, cancelled: Callable[[], bool]) -> None:
        """Produce records until cancelled() (called often, from this thread)."""

    def stop(self) -> None:
        """From any thread: make a run in progress return soon (unblocks a network read)."""

    def close(self) -> None:
        """Free what the source holds, once its run has returned."""

"""App-wide messages."""

from dataclasses import dataclass

from textual.message import Message

from swarmtune.engine.record.records import StepRecord


@dataclass
class StepsArrived(Message):
    """New step records from the engine worker; at most ~10 a second reach the UI."""

    records: list[StepRecord]


@dataclass
class EngineProgress(Message):
    what: str  # rebuild
    done: int
    total: int

    def can_replace(self, message: Message) -> bool:  # only the newest progress of the same kind matters
        return isinstance(message, EngineProgress) and message.what == self.what


@dataclass
class EngineFailed(Message):
    error: str


@dataclass
class Seeked(Message):
    """A replay moved: every record before the new position. Sent on the same queue as StepsArrived, so
    the batches sent before it are folded before the statistics are rebuilt from these."""

    before: list[StepRecord]

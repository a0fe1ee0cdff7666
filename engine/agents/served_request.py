"""A served request (an HTTP client's turn) as the engine takes it, and what it says back: its text as it
comes, its end, its usage, or that the server is busy or closing; and the record it leaves when it ends.
engine/agents/served.py places requests on agents; the server's APIs build and read these."""

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from swarmtune.engine.conversation.cache_miss import CacheMiss
from swarmtune.engine.conversation.formats.reader import ReplyReader
from swarmtune.engine.conversation.sampling import SamplingParams
from swarmtune.engine.conversation.text_stream import TextStream
from swarmtune.engine.record.records import RequestRecord, StepRecord


class Busy(Exception):
    """Every agent is busy and the queue is full: the client should come back later."""

    def __init__(self, queued: int, retry_after_s: int, why: str = "") -> None:
        super().__init__(why or f"all agents are busy and {queued} requests are queued; retry in {retry_after_s} s")
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class Delta:
    """Text for the client: whole characters, never a stop sequence's start."""

    text: str


@dataclass(frozen=True)
class Finished:
    reason: str  # stop | length | cancelled
    usage: Usage
    stop_sequence: str | None = None  # the one it stopped at, if a stop sequence ended it


@dataclass(frozen=True)
class Closed:
    """The server stops before the reply ends: the client gets an error, not a reply cut short as if whole."""

    message: str


@dataclass(eq=False)
class ServedRequest:
    prompt: list[int]
    max_tokens: int
    params: SamplingParams
    stop: tuple[str, ...] = ()
    key: str | None = None  # pins the conversation to an agent (the request's `user`, or a header)
    endpoint: str = "chat"
    reader: ReplyReader | None = None  # how its reply is read (a chat's; None: a raw completion)
    # called on the engine's thread (close_all: any thread); never blocks
    emit: Callable[[Delta | Finished | Closed], None] = lambda event: None
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    arrival: float = field(default_factory=time.perf_counter)
    cancelled: bool = False  # set by the server's thread when the client leaves
    # the engine's thread fills these in
    agent: int = -1
    assigned: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    token_gaps_s: list[float] = field(default_factory=list)
    cached_tokens: int = 0
    prefilled_tokens: int = 0
    copied_tokens: int = 0  # of cached_tokens, the cells copied from another agent's
    copied_from: int = -1  # that agent
    shifted_tokens: int = 0  # of cached_tokens, the cells kept past a divergence, shifted into place
    miss: CacheMiss | None = None  # why it prefilled what its conversation had held, or that it is new
    system_tokens: int = 0  # where the system prompt ends in `prompt` (0: unknown)
    trimmed: tuple[int, int] = (0, 0)  # --on-overflow trim-front: the oldest messages dropped to fit, their tokens
    prefill_s: float = 0.0  # the seconds of the steps it was in, by kind
    decode_s: float = 0.0
    joules: float | None = None  # its share of those steps' energy
    power_source: str = ""
    completion_tokens: int = 0
    # its agent's drafted and kept tokens (speculation) when it took the request, and when the request ended
    drafts_at: tuple[int, int] = (0, 0)
    drafts_end: tuple[int, int] | None = None
    generated: list[int] = field(default_factory=list)  # the tokens whose text was sent
    finish_reason: str | None = None
    text: TextStream = field(init=False)
    prompt_tokens: int = field(init=False)  # as the client sent it (`prompt` grows if it moves to another agent)

    def __post_init__(self) -> None:
        self.text = TextStream(self.stop)
        self.prompt_tokens = len(self.prompt)

    def took(self, token: int, now: float) -> None:
        """A token generated for it at `now` (perf_counter), its text not yet sent."""
        if self.first_token is None:
            self.first_token = now
        elif self.last_token is not None:
            self.token_gaps_s.append(now - self.last_token)
        self.last_token = now
        self.completion_tokens += 1
        self.generated.append(token)

    def charge(self, step: StepRecord, joules: float | None) -> None:
        """A step it was in: its seconds, by kind, and its share of the step's energy (None: no figure)."""
        if step.kind == "prefill":
            self.prefill_s += step.seconds
        elif step.kind == "decode":
            self.decode_s += step.seconds
        if joules is not None:
            self.joules = (self.joules or 0.0) + joules
            self.power_source = step.power_source or ""


CALL_TEXT_KEPT = 400  # of a reply whose call failed to parse, the last characters a record keeps


def request_record(req: ServedRequest, now_s: float, end: float) -> RequestRecord:
    """What a request that ended at `end` (perf_counter; the engine's clock now_s) wrote, less the seconds
    and energy of the step that ended it (ServedAgents.on_record adds them)."""
    rec = RequestRecord(
        id=req.id, t=round(now_s, 6), agent=req.agent, key=req.key or "",
        queue_s=round((req.assigned or end) - req.arrival, 6), prompt_tokens=req.prompt_tokens,
        cached_tokens=req.cached_tokens, prefilled_tokens=req.prefilled_tokens,
        ttft_s=round(req.first_token - req.arrival, 6) if req.first_token is not None else None,
        completion_tokens=req.completion_tokens, finish_reason=req.finish_reason or "",
        e2e_s=round(end - req.arrival, 6), endpoint=req.endpoint, copied_tokens=req.copied_tokens,
        copied_from=req.copied_from, shifted_tokens=req.shifted_tokens,
    )
    if req.first_token is not None and req.assigned is not None:
        rec.prefill_time_s = round(req.first_token - req.assigned, 6)
    if gaps := req.token_gaps_s:
        rec.itl_s, rec.itl_max_s = round(sum(gaps) / len(gaps), 6), round(max(gaps), 6)
    if (end_at := req.drafts_end) is not None:
        rec.draft_tokens, rec.accepted_draft_tokens = end_at[0] - req.drafts_at[0], end_at[1] - req.drafts_at[1]
    if (m := req.miss) is not None:
        rec = replace(rec, miss_at=m.at, miss_cause=m.cause, miss_words=m.words, miss_old=m.old, miss_new=m.new)
    if (reader := req.reader) is not None:
        reply = reader.read(req.text.text)
        rec.family, rec.reasoning_chars = reader.label, len(reply.reasoning)
        if reply.broken:  # a call the model began that did not parse: its text stays, for whoever reads why
            rec.call_miss, rec.call_miss_text = reply.broken, req.text.text[-CALL_TEXT_KEPT:]
    return rec

"""What one step produced, and the JSON-lines file a recording is made of.

A recording is a header line, then one line per step, each flushed as it is written, so a killed
recorder leaves at most its last line partial; the reader skips such a line.
"""

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import IO, Any

import orjson

from swarmtune.engine.errors import UserError
from swarmtune.engine.kv.types import KVSetting, known_kv, read_kv
from swarmtune.engine.tune.events import TuneEvent, event_from_json


def mean_context(contexts: Iterable[float]) -> float:
    """The mean of agents' contexts, tokens (a record's `mean_context`); 0 for no agent."""
    c = list(contexts)
    return sum(c) / len(c) if c else 0.0


# 1: every step line lists every agent (recordings before the header said `format`); 2: a step line lists the
# agents whose view changed since the line before it, and `agents_gone` the ids no longer there
RECORD_FORMAT = 2


@dataclass(frozen=True)
class AgentView:
    """An agent as a step left it. Frozen: the recorder hands the same view to every record until its agent
    changes, and its JSON is made once (view_json)."""

    id: int
    context: int  # tokens in this agent's KV cache after the step
    # decoding | waiting | prefilling | preempted | tool (waiting for a tool call to return) | client (a served
    # agent waiting for its client's next request)
    state: str
    limit: int  # its context limit, tokens
    generated: int  # tokens it has generated since the run began
    turns: int
    tail: str  # the end of the text it is generating
    residency: str = "cache"  # where its history is: cache (KV cells) | host (swapped out) | none (dropped)
    label: str = ""  # a served agent: its conversation's key (the request's `user`, a header, or its own)
    reused: int | None = None  # a served agent: tokens of its last prompt whose cells were reused
    miss: str = ""  # a served agent: why its last prompt prefilled what it had held, in short ("" if it did not)
    drafted: int = 0  # speculation: tokens it drafted since the start (a verify step's rows past its own)
    accepted: int = 0  # of those, the tokens its draws agreed with
    pending: int = 0  # tokens still to prefill (a prompt, a tool result): `context` of `context + pending` done
    # a served agent's request: its wait in the queue, and arrival to its first token once one came (None: none
    # yet, or not served), measured, seconds
    queue_s: float | None = None
    ttft_s: float | None = None


def _plain(v: Any) -> Any:
    """What orjson does not write itself: numpy scalars and enums, as their values."""
    if hasattr(v, "item"):
        return v.item()
    if isinstance(v, Enum):
        return v.value
    raise TypeError(f"{type(v).__name__} is not JSON")


def dumps(v: Any) -> bytes:
    """Compact JSON as bytes: UTF-8 where json.dumps wrote \\u escapes, null for NaN and infinities (which are not
    JSON); json.loads reads both the same."""
    return orjson.dumps(v, default=_plain, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY)


def view_json(v: AgentView) -> bytes:
    """A view's JSON, made once: a view the recorder kept (its agent unchanged) is not serialized again, whoever
    reads it (the record file, the API, the dashboard). Kept in the instance's dict, which orjson does not
    write (its underscore), beside the frozen fields."""
    b: bytes | None = v.__dict__.get("_json")
    if b is None:
        b = dumps(v)
        v.__dict__["_json"] = b
    return b


@dataclass
class Move:
    """A history moved between the KV cache and host memory (or dropped, or converted by a KV switch)."""

    agent: int
    # swap_out | swap_in | swap_in_refused | drop | swap_discarded | swap_evicted (past the host-memory bound)
    # | convert_save | convert | paste (a kept chunk of its old cells put back after an edit)
    op: str
    bytes: int
    seconds: float
    source: str  # measured, or modeled (the sim: bytes over the profile's host link)
    cells: int = 0  # paste: the cells its sequence held after it (a paste saves and sets them all)


@dataclass(frozen=True)
class RequestLatency:
    """A served request that ended, its latency apart (measured, seconds; RequestRecord's fields of the same
    names): arrival to an agent taking it (queue_s), then to its first token (prefill_time_s; ttft_s the two
    together), the mean and longest gap between its tokens, arrival to its end."""

    id: str
    agent: int
    queue_s: float
    prefill_time_s: float | None
    ttft_s: float | None
    itl_s: float | None
    itl_max_s: float | None
    e2e_s: float
    completion_tokens: int
    # a chat's reply as its family's format read it: the family, whether it reasoned, a call that did not parse
    family: str = ""
    reasoned: bool = False
    call_miss: str = ""


@dataclass
class StepRecord:
    step: int
    t: float  # seconds since the run began (simulated seconds for the sim backend)
    kind: str  # decode | prefill | rebuild | idle (every agent waits for a tool) | tune (a tuner's decision)
    batch: int
    batch_ids: list[int]
    batch_cap: int
    kv_type: str
    agents: list[AgentView]
    weight_bytes: int  # weight bytes this step read, shared by the whole batch: W(B) (engine/model/bytes_model.py)
    kv_bytes: float  # KV bytes this step read: sum over the batch of K(L), each layer at most its window
    seconds: float  # the step's own time (decode + sampling), measured or simulated
    tokens: int  # tokens this step generated (decode) or ingested (prefill, rebuild)
    source: str  # measured | simulated
    watts: float | None = None
    joules: float | None = None
    power_source: str | None = None
    mean_context: float = 0.0  # the batch's mean context, tokens
    tokens_per_second: float | None = None
    measured_speedup: float | None = None  # vs the batch-1 reference at the same context
    # B(W(1)+s+K(L))/(W(B)+B(s+K(L))), modeled: the seed's B(W+Lk)/(W+BLk) for a dense model
    predicted_speedup: float | None = None
    calibrated_speedup: float | None = None  # from the fit to this machine's measurements, modeled
    # the calibrated step-time model (engine/measure/step_model.py): t = g(B) + c*sum(L), g piecewise linear through
    # {"knots": [[B, seconds]...], "per_kv_token_seconds", "rms_error" (in-sample), "median_error" (each step
    # predicted before it was learned), "checked", "samples"}; older recordings hold [a, b, c, rms]
    fit: dict[str, Any] | list[float] | None = None
    joules_per_token: float | None = None
    tokens_per_joule: float | None = None
    # one more agent in the batch: J/token now and with it (modeled from the step-time fit and the power model)
    modeled_joules_per_token: float | None = None
    next_agent_joules_per_token: float | None = None
    preempted: list[int] = field(default_factory=list)
    note: str = ""
    reference: bool = False  # a batch-1 step run to time the reference, not the swarm's own batch
    # recurrent models: the per-agent state this step read, summed over the batch (B x s)
    state_bytes: float | None = None
    # MoE models: distinct experts per MoE layer the step's tokens routed to, and where the count came from:
    # "measured" (llama.cpp's routing, --moe-routing) or "modeled" (uniform routing, E(1-(1-k/E)^B))
    distinct_experts: float | None = None
    distinct_experts_source: str | None = None
    # histories moved since the last step: {"agent", "op" (swap_out | swap_in | swap_in_refused | drop |
    # swap_discarded: a KV switch made the saved state unreadable; convert_save, convert: a KV switch saved a
    # history and converted its rows to the new type, engine/kv/convert.py),
    # "bytes", "seconds", "source" (measured, or modeled on the sim: bytes over the profile's host link)}
    moved: list[Move] = field(default_factory=list)
    residency_seconds: float = 0.0  # the moves' seconds, outside `seconds`
    converted_tokens: int = 0  # kind "rebuild": cached tokens converted to the new KV type, not prefilled again
    refused_kv: str | None = None  # kind "rebuild": a KV type this build could not make (the old one kept)
    # kind "tune": the tuner's decision or its outcome (engine/tune/): phase, setting before and after,
    # why, the predicted gain (modeled: a forecast) and, once measured, the measured gain
    tune: TuneEvent | None = None
    # speculation (--draft): the agents that carried drafts into this decode step, the drafted tokens it
    # verified, and of those the ones its agents kept (counted in `tokens`: a step generates batch + accepted)
    drafts: int = 0
    drafted: int = 0
    accepted: int = 0
    # a decode step that carried a prefill chunk in the same call (engine/spec/mix_policy.py): its tokens (not in
    # `tokens`, which counts the tokens generated; its agent's prefill steps carry the rest)
    prefill_tokens: int = 0
    # the speculation setting in force (--draft): the most tokens an agent drafts, or "auto"; "0": off
    draft_setting: str = "0"
    # served requests that ended in this step, their latency apart (the request records, written beside the
    # steps, hold the whole account): what the dashboard's percentiles fold, wherever it reads the steps from
    ended: list[RequestLatency] = field(default_factory=list)
    # tokens of cache histories lost in this step, to be prefilled again: preempted, dropped at a tool, refused
    # their way back from host memory or evicted from it (a KV switch's rebuild apart: `tokens` of kind
    # "rebuild"). The churn a KV budget causes, which a forecast's tally counts (left out of a line where 0)
    lost_tokens: int = 0
    # a decode under --draft-model: the draft model's seconds before the step, counted in `seconds` (the swarm
    # waited for them) and not in what the step-time fits learn (left out of a line where 0)
    drafting_s: float = 0.0
    type: str = "step"

    @property
    def kv(self) -> KVSetting:
        """kv_type, the setting's spelling a recording holds, read back as the setting (an attached engine's
        unreported one counted at f16)."""
        return read_kv(self.kv_type)

    def to_json(self) -> str:
        return self.to_bytes().decode()

    def to_bytes(self, agents: list[AgentView] | None = None, gone: list[int] | None = None) -> bytes:
        """The step's line, every agent in it (as the API serves it), or of these agents only and the ids gone
        (a format 2 file's line). The fields as they are, not asdict's deep copies, and each view's JSON made
        once (view_json): at 64 agents json.dumps of the whole cost 240 us, this 30."""
        d = {name: getattr(self, name) for name in _STEP_FIELDS}
        views = self.agents if agents is None else agents
        d["agents"] = orjson.Fragment(b"[" + b",".join([view_json(v) for v in views]) + b"]")
        d["tune"] = None if self.tune is None else self.tune.to_json()
        if not self.ended:
            del d["ended"]  # most steps end no request: a line costs what changed
        if not self.lost_tokens:
            del d["lost_tokens"]
        if not self.drafting_s:
            del d["drafting_s"]
        if gone:
            d["agents_gone"] = gone
        return dumps(d)


_STEP_FIELDS = tuple(f.name for f in fields(StepRecord))


@dataclass
class RequestRecord:
    """One served request (an HTTP client's), written beside the step records when it ends. Times are
    measured, in seconds; t is the engine's clock at its end."""

    id: str
    t: float
    agent: int  # the agent that served it (-1: it never left the queue)
    key: str  # its conversation's key
    queue_s: float  # arrival to an agent taking it
    prompt_tokens: int
    cached_tokens: int  # of the prompt, the tokens whose cells were reused (kept, swapped in or copied)
    prefilled_tokens: int  # of the prompt, the tokens prefilled for it
    ttft_s: float | None  # arrival to its first token (None: none came)
    completion_tokens: int
    finish_reason: str  # stop | length | cancelled (its client left) | error
    e2e_s: float  # arrival to its end
    endpoint: str = ""  # chat | completions
    copied_tokens: int = 0  # of cached_tokens, the cells copied from another agent's (a shared prefix)
    copied_from: int = -1  # that agent
    shifted_tokens: int = 0  # of cached_tokens, old cells kept past a divergence and shifted into place
    # why it prefilled what its conversation had held, or that it was new (engine/conversation/cache_miss.py): the first
    # prompt position not reused, the cause (a word, and in words), the text there before and now
    miss_at: int | None = None
    miss_cause: str = ""
    miss_words: str = ""
    miss_old: str = ""
    miss_new: str = ""
    # the steps it was in: their seconds by kind, and its share of their energy (engine/measure/energy_share.py),
    # measured or modeled as the steps' power source says (None: the steps had no energy figure)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    joules: float | None = None
    power_source: str = ""
    # speculation (--draft): the tokens drafted in its steps, and of those the ones kept (in completion_tokens)
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    # its latency apart: an agent taking it to its first token (vLLM's request_prefill_time), and the gaps
    # between its tokens, their mean and the longest (None: fewer than two tokens). queue_s + prefill_time_s is
    # ttft_s; with itl_s times (completion_tokens - 1), e2e_s up to what came after its last token
    prefill_time_s: float | None = None
    itl_s: float | None = None
    itl_max_s: float | None = None
    # a chat's reply as its model's format read it (engine/conversation/formats/): the family ("unknown (read
    # as qwen3-hermes)" where the template is no known family's), the characters of reasoning split off, and a
    # call the model began that did not parse: why, and the reply's end as it was kept in the content
    family: str = ""
    reasoning_chars: int = 0
    call_miss: str = ""
    call_miss_text: str = ""
    type: str = "request"

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    def to_bytes(self) -> bytes:
        return dumps(self)


def step_from_dict(d: dict[str, Any]) -> StepRecord:
    d = dict(d)
    d.pop("type", None)
    d.pop("agents_gone", None)
    d["agents"] = [AgentView(**a) for a in d.get("agents", [])]
    d["moved"] = [Move(**m) for m in d.get("moved", [])]
    d["ended"] = [RequestLatency(**q) for q in d.get("ended", [])]
    if d.get("tune") is not None:
        d["tune"] = event_from_json(d["tune"])
    known_kv(str(d.get("kv_type", "")))  # a setting this version cannot read is a bad line, said where it is
    return StepRecord(**d)


class RecordWriter:
    """Writes a header, then steps, each line flushed as written: a killed writer loses at most its last line.
    A step line carries the agents whose view changed since the line before it (format 2)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fh: IO[bytes] | None = None
        self._last: dict[int, AgentView] = {}  # the views as the file has them

    def open(self, header: dict[str, Any]) -> None:
        if self.path.parent and not self.path.parent.is_dir():
            raise UserError(f"cannot write {self.path}: folder {self.path.parent} does not exist")
        try:
            self._fh = self.path.open("wb")
        except OSError as e:
            raise UserError(f"cannot write {self.path}: {e.strerror}") from None
        self._last = {}
        self._write(dumps({"type": "header", **header, "format": RECORD_FORMAT}))

    @property
    def opened(self) -> bool:
        return self._fh is not None

    def write(self, record: "StepRecord | RequestRecord") -> None:
        if isinstance(record, RequestRecord):
            self._write(record.to_bytes())
            return
        last = self._last
        # a view the last line had is the same object while its agent is unchanged (the recorder keeps it); one
        # read back from another engine's stream is a new object, equal where unchanged
        changed = [v for v in record.agents if (p := last.get(v.id)) is not v and p != v]
        now = {v.id: v for v in record.agents}
        gone = [i for i in last if i not in now] if len(now) != len(last) or any(v.id not in last for v in changed) \
            else []
        self._last = now
        self._write(record.to_bytes(changed, gone))

    def _write(self, line: bytes) -> None:
        assert self._fh is not None
        self._fh.write(line + b"\n")
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


@dataclass
class Recording:
    header: dict[str, Any]
    steps: list[StepRecord]
    skipped_partial: bool  # the last line was cut (a killed recorder) and was skipped


def iter_lines(path: Path) -> Iterator[tuple[str, bool]]:
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        for line in fh:
            yield line, line.endswith("\n")


def read_recording(path: str | Path) -> Recording:
    p = Path(path)
    if not p.is_file():
        raise UserError(f"recording not found: {p}")
    header: dict[str, Any] | None = None
    steps: list[StepRecord] = []
    skipped = False
    views: dict[int, dict[str, Any]] = {}  # format 2: every agent's view as the lines so far left it
    for n, (line, complete) in enumerate(iter_lines(p), start=1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            if not complete:
                skipped = True  # a killed writer's last line
                break
            raise UserError(f"{p}: line {n} is not JSON; not a swarmtune recording") from None
        if not isinstance(d, dict):
            raise UserError(f"{p}: line {n} is not a record; not a swarmtune recording")
        if header is None:
            if d.get("type") != "header":
                raise UserError(f"{p}: first line is not a swarmtune header")
            header = d
            continue
        if d.get("type") != "step":
            continue
        try:
            if header.get("format", 1) >= 2:
                for a in d.get("agents", []):
                    views[a["id"]] = a
                for i in d.get("agents_gone", []):
                    views.pop(i, None)
                d["agents"] = list(views.values())
            steps.append(step_from_dict(d))
        except (TypeError, ValueError, KeyError, UserError) as e:
            if not complete:
                skipped = True
                break
            raise UserError(f"{p}: line {n} is not a step record ({e})") from None
    if header is None:
        raise UserError(f"{p}: empty file; not a swarmtune recording")
    return Recording(header, steps, skipped)


def remove_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass

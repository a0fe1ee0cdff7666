"""Engines people already run, read-only: llama.cpp's llama-server and vLLM, polled over HTTP and
turned into step records so the same panels can show them.

What the remote does not tell (W, k) comes from the user: --gguf PATH, or --weight-bytes and
--kv-bytes-per-token. Every record is labelled measured:<engine> (the remote's own counters); what is
derived from them says how in the record's note (estimated contexts on vLLM), and the speedups are
modeled from B, L, W and k exactly as for our own engine.

llama-server: live rates come from the per-slot counters of GET /slots, diffed between polls, and a slot
processing its prompt is a phase of its own (prefilling). `llamacpp:tokens_predicted_total` moves only
when a task ends, so it cannot give a live rate: /metrics is optional (--metrics), and only fills in the
last tokens of a task that ended unseen and the server's own prompt rate.

vLLM reports no per-request context: the mean is estimated from its KV cache use, and labelled so."""

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from swarmtune.engine.errors import UserError
from swarmtune.engine.kv.types import UNKNOWN_KV
from swarmtune.engine.measure.speedup import predicted_speedup
from swarmtune.engine.measure.step_model import Calibration
from swarmtune.engine.model.bytes_model import ByteModel
from swarmtune.engine.record.records import AgentView, StepRecord, mean_context


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse_samples(text: str) -> list[Sample]:
    return [Sample(s.name, dict(s.labels), float(s.value)) for fam in text_string_to_metric_families(text)
            for s in fam.samples]


def parse_metrics(text: str | list[Sample]) -> dict[str, float]:
    """Prometheus text (or its parsed samples) to {sample name: value}, summed over label sets."""
    out: dict[str, float] = {}
    for s in parse_samples(text) if isinstance(text, str) else text:
        out[s.name] = out.get(s.name, 0.0) + s.value
    return out


@dataclass
class StepTiming:
    """Decode step times from the intervals between polls where the batch ran undisturbed: the calibrated
    step-time model t = a + b*B + c*sum(L) fitted to them, as for our own engine."""

    calibration: Calibration = field(default_factory=Calibration)
    batch_sizes: set[int] = field(default_factory=set)

    def add(self, batch: int, total_context_tokens: float, step_seconds: float) -> None:
        self.calibration.add(batch, total_context_tokens, step_seconds)
        self.batch_sizes.add(batch)
        self.calibration.refit()

    def speedup(self, batch: int, context_tokens: float) -> tuple[float | None, dict[str, Any] | None]:
        """(calibrated speedup, fit) once two batch sizes were timed: with one, the fixed and per-agent
        costs cannot be told apart, and the speedup would be an artefact of the solver."""
        fit = self.calibration.fit
        if fit is None or len(self.batch_sizes) < 2 or batch < 1:
            return None, None
        return fit.speedup(batch, context_tokens), fit.record



class ForeignPoller:
    """Base: one poll is one record; its `t` is seconds on `clock` since the first poll."""

    engine = ""
    context_source = ""

    def __init__(self, url: str, weight_bytes: float | None, kv_bytes_per_token: float | None,
                 timeout_s: float = 5.0, clock: Callable[[], float] = time.perf_counter,
                 bytes_model: ByteModel | None = None) -> None:
        self.url = url.rstrip("/")
        # from --gguf: what a step reads layer by layer (windows, experts, recurrent state); the remote's cache
        # type is not reported, so its KV is counted at f16, the default of both engines
        self.bytes_model = bytes_model
        self.http = httpx.Client(base_url=self.url, timeout=timeout_s)
        self.weight_bytes = weight_bytes
        self.k = kv_bytes_per_token
        self.clock = clock
        self.step = 0
        self.t0: float | None = None
        self._last_t: float | None = None
        self.timing = StepTiming()

    def poll(self) -> StepRecord:
        """One record of what the engine did since the last poll."""
        raise NotImplementedError

    def header(self) -> dict[str, Any]:
        kv = {"remote": self.k} if self.k else {}
        return {
            "model": {"name": self.model_name(), "path": self.url, "architecture": "remote"},
            "weight_bytes": self.weight_bytes or 0,
            "kv_bytes_per_token": kv,
            "backend": self.engine, "device": self.url, "versions": {}, "settings": {},
            "source": f"measured:{self.engine}", "read_only": True, "context_source": self.context_source,
            "power": {"source": None, "detail": f"n/a: {self.engine} does not report power"},
            **({"bytes_model": self.bytes_model.to_dict()} if self.bytes_model else {}),
        }

    def model_name(self) -> str:
        return self.engine

    def _interval(self) -> tuple[float, float]:
        """(now, seconds since the previous poll; 0 at the first)."""
        now = self.clock()
        if self.t0 is None:
            self.t0 = now
        seconds = now - self._last_t if self._last_t is not None else 0.0
        self._last_t = now
        return now, seconds

    def _record(self, now: float, agents: list[AgentView], batch_ids: list[int], tokens: int, seconds: float,
                batch_cap: int, kind: str = "decode", note: str = "") -> StepRecord:
        k = self.k or 0.0
        ctx = [a.context for a in agents if a.id in batch_ids]
        mean = mean_context(ctx)
        b = len(batch_ids)
        rec = StepRecord(
            step=self.step, t=round(now - (self.t0 or now), 3), kind=kind, batch=b,
            batch_ids=batch_ids, batch_cap=batch_cap, kv_type=UNKNOWN_KV, agents=agents,
            weight_bytes=int(self.weight_bytes or 0), kv_bytes=sum(ctx) * k, seconds=seconds, tokens=tokens,
            source=f"measured:{self.engine}", mean_context=mean,
            tokens_per_second=tokens / seconds if seconds > 0 else None, note=note,
        )
        bm = self.bytes_model
        if bm is not None and b:
            rec.kv_bytes = sum(bm.kv_read_bytes(rec.kv, c) for c in ctx)  # an unreported type: counted at f16
            rec.weight_bytes = int(bm.weight_bytes(b))
        if kind == "decode" and b:
            if bm is not None:
                rec.predicted_speedup = bm.speedup_mixed(ctx, rec.kv)
            elif self.weight_bytes and self.k:
                rec.predicted_speedup = predicted_speedup(b, mean, self.weight_bytes, self.k)
            rec.calibrated_speedup, rec.fit = self.timing.speedup(b, mean)
        self.step += 1
        return rec

    def close(self) -> None:
        self.http.close()


# llama-server ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SlotReading:
    """One slot as llama-server's GET /slots shows it (field names of tools/server in llama.cpp)."""

    id: int
    limit_tokens: int  # n_ctx of the slot
    processing: bool
    task: int | None  # id_task; absent on a slot that never had one
    prompt_tokens: int  # the task's prompt; for an idle slot 0 (unknown)
    prompt_done_tokens: int  # of the prompt, tokens in the cache: reused (cache) + processed
    reused_tokens: int  # of those, reused from the slot's cache (no work): n_prompt_tokens_cache
    decoded: int  # tokens decoded by the task in progress; 0 once the slot is idle
    remain: int  # tokens the task may still decode; -1: no limit, or unknown
    held_tokens: int  # n_prompt_tokens of an idle slot: its last task's cells, prompt + decoded - 1

    @property
    def phase(self) -> str:
        """prompt (processing its prompt) | generating | idle."""
        if not self.processing:
            return "idle"
        return "generating" if self.decoded > 0 else "prompt"

    @property
    def context_tokens(self) -> int:
        """Tokens in the slot's cache, as far as its counters tell."""
        if not self.processing:
            return self.held_tokens
        return self.prompt_done_tokens + self.decoded


def parse_slot(d: dict[str, Any], index: int) -> SlotReading:
    nt = d.get("next_token") or [{}]
    nt = nt[0] if isinstance(nt, list) and nt else (nt if isinstance(nt, dict) else {})
    decoded = int(nt.get("n_decoded", 0) or 0)
    processing = bool(d.get("is_processing"))
    n_prompt = int(d.get("n_prompt_tokens", 0) or 0)
    reused = int(d.get("n_prompt_tokens_cache", 0) or 0)
    if "n_prompt_tokens_processed" in d:
        done = reused + int(d.get("n_prompt_tokens_processed", 0) or 0)
        # while a task runs, n_prompt_tokens counts its decoded tokens too
        prompt = n_prompt - decoded if processing else 0
    else:  # older builds: n_prompt_tokens is the prompt alone, and no progress is reported
        done, prompt = n_prompt, n_prompt if processing else 0
    task = d.get("id_task")
    return SlotReading(
        id=int(d.get("id", index)), limit_tokens=int(d.get("n_ctx", 0) or 0), processing=processing,
        task=int(task) if task is not None and int(task) >= 0 else None, prompt_tokens=max(prompt, 0),
        prompt_done_tokens=done, reused_tokens=reused, decoded=decoded, remain=int(nt.get("n_remain", -1)),
        held_tokens=0 if processing else n_prompt + decoded,
    )


@dataclass(frozen=True)
class SlotDelta:
    """What one slot did between two polls."""

    decoded: int  # tokens decoded, the end of a finished task included where the slot shows it
    prompt: int  # prompt tokens processed
    ended_final: int | None = None  # the final token count of a task that ended and whose end the slot shows
    # a task ended and another took the slot: its last tokens are not in `decoded`; it had decoded
    # `hidden_seen` at the previous poll, and had at most `hidden_bound` left (-1: no limit known)
    hidden: bool = False
    hidden_seen: int = 0
    hidden_bound: int = -1
    steady: bool = False  # the same task generated at both polls: the interval timed its steps cleanly
    prompt_phase: bool = False  # a prompt in flight at either poll: its chunks share the steps


def slot_delta(prev: SlotReading, now: SlotReading) -> SlotDelta:
    """A counter that goes down (a reset) or a new task id is a new origin, never a negative rate."""
    if now.task is not None and now.task == prev.task:
        if now.processing:
            grew = now.decoded - prev.decoded
            decoded = grew if grew >= 0 else now.decoded
            prompt = max(now.prompt_done_tokens - prev.prompt_done_tokens, 0) if prev.processing else 0
            steady = prev.phase == "generating" and now.phase == "generating" and grew > 0 and prompt == 0
            return SlotDelta(decoded, prompt, steady=steady, prompt_phase="prompt" in (prev.phase, now.phase))
        if prev.processing:  # it ended since: an idle slot's cells (prompt + decoded - 1) say how far it got
            final = now.held_tokens - prev.prompt_tokens + 1
            top = prev.decoded + prev.remain if prev.remain >= 0 else final
            final = min(max(final, prev.decoded), top)
            prompt = max(prev.prompt_tokens - prev.prompt_done_tokens, 0)
            return SlotDelta(final - prev.decoded, prompt, ended_final=final, prompt_phase=prev.phase == "prompt")
        return SlotDelta(0, 0)
    # a new task (or none): everything it shows happened since the previous poll
    fresh = max(now.prompt_done_tokens - now.reused_tokens, 0) if now.processing else 0
    return SlotDelta(now.decoded if now.processing else 0, fresh,
                     hidden=prev.processing, hidden_seen=prev.decoded, hidden_bound=prev.remain,
                     prompt_phase="prompt" in (prev.phase, now.phase))


@dataclass(frozen=True)
class PollTotals:
    """A llama-server poll folded over its slots."""

    decoded: int
    prompt: int
    unseen_tokens: int  # last tokens of tasks that ended unseen, recovered from tokens_predicted_total
    steady: bool  # every generating slot steady, no prompt processed: a clean step timing
    steps: int  # decode steps in the interval (the busiest slot's tokens), where steady


def fold_deltas(deltas: list[SlotDelta], predicted_delta: float | None) -> PollTotals:
    """Sum the slots; `predicted_delta` (tokens_predicted_total's growth, or None without --metrics) counts
    the final tokens of every task that ended, so less those the slots showed, it gives the tails no slot
    shows (bounded by each such task's n_remain: two HTTP reads are never one snapshot)."""
    decoded = sum(d.decoded for d in deltas)
    busiest = max((d.decoded for d in deltas), default=0)  # no task decodes more tokens than there were steps
    unseen = 0
    hidden = [d for d in deltas if d.hidden]
    if predicted_delta is not None and hidden:
        # the counter grew by the final count of each task that ended: those the slots showed are known,
        # the hidden ones had got to `hidden_seen` (counted at earlier polls); what is left is their tails
        left = predicted_delta - sum(d.ended_final or 0 for d in deltas) - sum(d.hidden_seen for d in hidden)
        bound = sum(d.hidden_bound if d.hidden_bound >= 0 else busiest for d in hidden)
        unseen = int(min(max(left, 0), bound))
    generating = [d for d in deltas if d.decoded > 0 or d.steady]
    steady = (bool(generating) and all(d.steady for d in generating) and not hidden
              and not any(d.prompt or d.prompt_phase or d.ended_final is not None for d in deltas))
    steps = busiest if steady else 0
    return PollTotals(decoded + unseen, sum(d.prompt for d in deltas), unseen, steady, steps)


class LlamaServerPoller(ForeignPoller):
    engine = "llama-server"
    context_source = "measured:llama-server /slots (per-slot prompt and decoded counts)"

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self._slots: dict[int, SlotReading] = {}
        self._generated: dict[int, int] = {}  # per slot since we attached: a rate that survives new tasks
        self._metrics: bool | None = None  # None: not asked yet
        self._counters: dict[str, float] | None = None  # /metrics at the previous poll

    def model_name(self) -> str:
        try:
            props = self.http.get("/props").json()
        except (httpx.HTTPError, ValueError):
            return "llama-server"
        path = props.get("model_path") or props.get("model_alias") or "llama-server"
        return str(path).rsplit("/", 1)[-1]

    def _read_slots(self) -> list[SlotReading]:
        r = self.http.get("/slots")
        if r.status_code in (404, 501):
            raise UserError(f"{self.url}/slots answers {r.status_code}: start llama-server without --no-slots "
                            "(swarmtune reads its per-slot counters)")
        r.raise_for_status()
        data = r.json()
        if not isinstance(data, list):
            raise ValueError("/slots did not answer a list")
        return [parse_slot(d, i) for i, d in enumerate(data) if isinstance(d, dict)]

    def _counter_growth(self) -> dict[str, float] | None:
        """Each /metrics counter's growth since the previous poll, where --metrics is on (else None)."""
        if self._metrics is False:
            return None
        try:
            r = self.http.get("/metrics")
        except httpx.HTTPError:
            return None
        if r.status_code != 200:
            self._metrics = False  # without --metrics it answers 501: do not ask again
            return None
        self._metrics = True
        now, last = parse_metrics(r.text), self._counters
        self._counters = now
        if last is None:
            return None
        return {name: max(v - last.get(name, v), 0.0) for name, v in now.items()}

    def poll(self) -> StepRecord:
        slots = self._read_slots()
        now, seconds = self._interval()
        growth = self._counter_growth()
        predicted = growth.get("llamacpp:tokens_predicted_total") if growth else None
        first = self.step == 0
        deltas = [] if first else [slot_delta(self._slots.get(s.id, s), s) for s in slots]
        totals = fold_deltas(deltas, predicted)
        agents, batch, prompting = [], [], []
        by_id = dict(zip([s.id for s in slots], deltas, strict=False))
        for s in slots:
            d = by_id.get(s.id)
            self._generated[s.id] = self._generated.get(s.id, 0) + (d.decoded if d else 0)
            state = {"generating": "decoding", "prompt": "prefilling", "idle": "idle"}[s.phase]
            if s.phase == "generating":
                batch.append(s.id)
            elif s.phase == "prompt":
                prompting.append(s)
            tail = (f"prompt of {s.prompt_tokens:,} tokens" if s.phase == "prompt"
                    else f"task {s.task}" if s.task is not None else "")
            agents.append(AgentView(id=s.id, context=s.context_tokens, state=state, limit=s.limit_tokens,
                                    generated=self._generated[s.id], turns=0, tail=tail))
        self._slots = {s.id: s for s in slots}
        if totals.steady and totals.steps and seconds > 0:
            # the contexts grew through the interval: its steps saw, on average, those of its middle
            ctx = sum(s.context_tokens for s in slots if s.id in batch) - len(batch) * totals.steps / 2
            self.timing.add(len(batch), ctx, seconds / totals.steps)
        notes = []
        if totals.prompt:
            # a prompt may have run since long before this interval: only the server's own clock gives its rate
            prompt_s = growth.get("llamacpp:prompt_seconds_total", 0.0) if growth else 0.0
            prompt_tokens = growth.get("llamacpp:prompt_tokens_total", 0.0) if growth else 0.0
            rate = f" ({prompt_tokens / prompt_s:,.0f} tok/s, measured by the server)" if prompt_s > 0 else ""
            notes.append(f"prompt processed: {totals.prompt:,} tokens{rate}")
        if prompting:
            notes.append("prompt phase: " + ", ".join(f"slot {s.id} ({s.prompt_tokens:,} tokens)" for s in prompting))
        if totals.unseen_tokens:
            notes.append(f"{totals.unseen_tokens} tokens of tasks that ended between polls, from /metrics")
        # a poll with only prompts in flight is a prefill step, as our own engine records one
        kind = "prefill" if prompting and not batch and not totals.decoded else "decode"
        tokens = totals.prompt if kind == "prefill" else totals.decoded
        return self._record(now, agents, batch, tokens, seconds, batch_cap=len(slots), kind=kind,
                            note="; ".join(notes))


# vLLM --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VllmContext:
    """The mean context of the running requests, estimated: vLLM reports no per-request length, only the
    share of its KV cache in use (blocks, so each request's last block counts whole; a prefix shared between
    requests counts once)."""

    mean_tokens: float | None
    why: str  # how it was estimated, or why it could not be


def estimate_vllm_context(samples: list[Sample], running: int) -> VllmContext:
    """Tokens in use (the usage gauge x the cache's tokens: num_gpu_blocks x block_size, the labels of the
    info gauge vllm:cache_config_info) over the running requests."""
    usages = [s.value for s in samples if s.name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")]
    usage = sum(usages) / len(usages) if usages else None  # one per engine (data parallel): their mean
    capacity = 0
    for s in samples:
        if s.name != "vllm:cache_config_info":
            continue
        try:  # one label set per engine: their caches add up
            capacity += int(s.labels["num_gpu_blocks"]) * int(s.labels["block_size"])
        except (KeyError, ValueError):  # "None" before the cache is sized
            continue
    if usage is None:
        return VllmContext(None, "n/a: no vllm:kv_cache_usage_perc")
    if not capacity:
        return VllmContext(None, "n/a: no num_gpu_blocks x block_size in vllm:cache_config_info")
    if running < 1:
        return VllmContext(None, "no running requests")
    return VllmContext(usage * capacity / running,
                       f"estimated: KV cache {usage:.0%} of {capacity:,} tokens / {running} running")


class VllmPoller(ForeignPoller):
    engine = "vllm"
    context_source = "estimated:vllm kv_cache_usage_perc x (num_gpu_blocks x block_size) / running requests"

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self._last: dict[str, float] | None = None
        self._limit = 0

    def model_name(self) -> str:
        try:
            models = self.http.get("/v1/models").json().get("data", [])
            if models:
                self._limit = int(models[0].get("max_model_len") or 0)
            return models[0]["id"] if models else "vllm"
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError, AttributeError):
            return "vllm"

    def _delta(self, c: dict[str, float], name: str) -> float:
        if self._last is None or name not in c:
            return 0.0
        return max(c[name] - self._last.get(name, c[name]), 0.0)  # a restart resets counters: not negative

    def poll(self) -> StepRecord:
        r = self.http.get("/metrics")
        r.raise_for_status()
        now, seconds = self._interval()
        samples = parse_samples(r.text)
        c = parse_metrics(samples)
        running = int(c.get("vllm:num_requests_running", 0))
        waiting = int(c.get("vllm:num_requests_waiting", 0))
        est = estimate_vllm_context(samples, running)
        ctx = round(est.mean_tokens) if est.mean_tokens is not None else 0
        agents = [AgentView(i, ctx if i < running else 0, "decoding" if i < running else "waiting", self._limit,
                            0, 0, "context estimated" if i < running and est.mean_tokens is not None else "")
                  for i in range(running + waiting)]
        tokens = int(self._delta(c, "vllm:generation_tokens_total"))
        prompt = int(self._delta(c, "vllm:prompt_tokens_total"))
        steps = self._delta(c, "vllm:iteration_tokens_total_count")
        if (self._last is not None and prompt == 0 and steps > 0 and seconds > 0 and est.mean_tokens is not None
                and running == int(self._last.get("vllm:num_requests_running", -1))):
            self.timing.add(running, running * est.mean_tokens, seconds / steps)
        self._last = c
        notes = [f"mean context {est.mean_tokens:,.0f} tokens ({est.why})" if est.mean_tokens is not None
                 else f"mean context {est.why}"]
        if prompt and seconds > 0:
            notes.append(f"prompt processing: {prompt:,} tokens ({prompt / seconds:,.0f} tok/s)")
        return self._record(now, agents, list(range(running)), tokens, seconds, batch_cap=running + waiting,
                            note="; ".join(notes))


def detect(url: str, token: str | None = None, timeout_s: float = 5.0) -> str:
    """swarmtune, llama-server or vllm: which engine answers at url."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=url.rstrip("/"), timeout=timeout_s, headers=headers) as h:
        r = h.get("/v1/info")
        if r.status_code == 200 and "kv_bytes_per_token" in r.text:
            return "swarmtune"
        if r.status_code == 401:
            return "swarmtune"
        r = h.get("/slots")
        if r.status_code == 200 and r.text.lstrip().startswith("["):
            return "llama-server"
        r = h.get("/metrics")
        if r.status_code == 200 and "vllm:" in r.text:
            return "vllm"
        if r.status_code == 200 and "llamacpp:" in r.text:
            return "llama-server"
    return "unknown"

"""A step's record: what it read (the bytes model's weights and cache), what each agent was doing, what
moved, what it cost in energy, and what the analysis makes of it (engine/measure/analysis.py)."""

import time

from swarmtune.engine.agents.agent import Agent, AgentState
from swarmtune.engine.backends.backend import Backend
from swarmtune.engine.batch_runner import Ran
from swarmtune.engine.measure.analysis import StepAnalysis
from swarmtune.engine.measure.power.meter import Meter
from swarmtune.engine.record.records import AgentView, Move, StepRecord, mean_context
from swarmtune.engine.settings import EngineSettings
from swarmtune.engine.tune.events import TuneEvent


class Recorder:
    def __init__(self, backend: Backend, settings: EngineSettings, analysis: StepAnalysis) -> None:
        self.backend = backend
        self.s = settings  # the engine's own: the KV type and batch cap in force
        self.analysis = analysis
        self._decoding_ids: set[int] = set()  # the last decode batch: who is decoding, not waiting
        # each agent's last view, handed to every record until the agent changes: a view is made, and its JSON
        # written (records.view_json), only for what changed
        self._views: dict[int, AgentView] = {}

    def record(self, step: int, t: float, ran: Ran, moved: list[Move], lost_tokens: int, agents: list[Agent],
               meter: Meter, step_t0: float) -> StepRecord:
        """The record of what a step ran, ended at t (the engine's clock), with the moves made since the last
        record; its energy from the meter over the wall time since step_t0. A decode's drafted tokens, its
        prefill chunk and its draft model's seconds are set before the analysis reads it: it learns its fits
        from plain steps, and from their seconds less the draft model's."""
        kind, batch, seconds, tokens = ran.kind, ran.batch, ran.seconds, ran.tokens
        bm = self.backend.facts.bytes_model
        kv = self.s.kv
        b = len(batch)
        # after the step: the cache the step read, its own tokens included (a windowed layer reads at most its
        # window); an untied embedding is read once per token the step carries (one per agent in a decode,
        # the chunk in a prefill); MoE: the experts the step's tokens routed to, measured where the backend
        # counted them, else uniform routing (modeled)
        contexts = [a.context for a in batch]
        # a tuner's forecast reads only a step's time, tokens and energy: no bytes, no agents' views
        lean = self.analysis.forecasting
        # llama.cpp's MoE counter (engine/backends/llama_steps.py StepWatch), where it counts
        watch = getattr(self.backend, "watch", None) if kind == "decode" else None
        measured = watch.last_distinct_experts if watch is not None else None
        distinct = sum(measured) / len(measured) if measured else None
        read = None if lean else bm.step_read(kv, contexts, tokens, distinct)
        kv_bytes = read.kv_bytes if read is not None else 0.0
        weight_bytes = (read.weight_step if read is not None else bm.weight_bytes(tokens, distinct)) if batch else 0
        rec = StepRecord(
            step=step, t=round(t, 6), kind=kind, batch=b, batch_ids=[a.id for a in batch],
            batch_cap=self.s.batch_cap, kv_type=self.s.kv.label, agents=[] if lean else self.views(kind, batch, agents),
            weight_bytes=int(weight_bytes), kv_bytes=float(kv_bytes), seconds=seconds, tokens=tokens,
            source=self.backend.source, mean_context=mean_context(contexts), preempted=ran.preempted, note=ran.note,
            tokens_per_second=tokens / seconds if seconds > 0 and kind != "idle" else None,
            draft_setting="auto" if self.s.draft_auto else str(self.s.draft_tokens),
            moved=moved, residency_seconds=sum(m.seconds for m in moved), drafted=ran.drafted,
            prefill_tokens=ran.prefill_tokens, drafting_s=ran.drafting_s,
        )
        if batch and bm.state_bytes:
            rec.state_bytes = b * bm.state_bytes
        if batch and bm.is_moe:
            rec.distinct_experts = distinct if distinct is not None else bm.expected_distinct_experts(tokens)
            rec.distinct_experts_source = "measured" if distinct is not None else "modeled"
        power = meter.step(step_t0, time.perf_counter(), b, seconds) if kind != "rebuild" else None
        if power is not None:
            rec.watts, rec.joules, rec.power_source = power.watts, power.joules, power.source
            if tokens:
                rec.joules_per_token = power.joules / tokens
                rec.tokens_per_joule = tokens / power.joules if power.joules > 0 else None
        self.analysis.annotate(rec, contexts, read, power)
        rec.reference, rec.converted_tokens, rec.drafts, rec.accepted = (
            ran.reference, ran.converted_tokens, ran.drafts, ran.accepted)
        rec.refused_kv = None if ran.refused_kv is None else ran.refused_kv.label
        rec.lost_tokens = lost_tokens
        return rec

    def tune_record(self, step: int, t: float, agents: list[Agent], tune: TuneEvent) -> StepRecord:
        """A tuner's decision (or its measured outcome) as a record of its own, kind "tune"."""
        return StepRecord(step=step, t=round(t, 6), kind="tune", batch=0, batch_ids=[], batch_cap=self.s.batch_cap,
                          kv_type=self.s.kv.label, agents=self.views("tune", [], agents), weight_bytes=0,
                          kv_bytes=0.0, seconds=0.0, tokens=0, source=self.backend.source, note=tune.why_text,
                          tune=tune)

    def views(self, kind: str, batch: list[Agent], agents: list[Agent]) -> list[AgentView]:
        """What each agent is doing after a step of this kind over this batch."""
        # a prefill step interrupts decoding without ending it: agents keep the state of the last decode batch
        if kind == "decode":
            self._decoding_ids = {a.id for a in batch}
        prefilled = {a.id for a in batch} if kind == "prefill" else set()
        kept = self._views
        out = []
        for a in agents:
            if a.id in prefilled:
                state = AgentState.PREFILL.value
            elif a.state is AgentState.DECODE:
                state = "decoding" if a.id in self._decoding_ids else "waiting"
            else:
                state = a.state.value
            v = kept.get(a.id)
            # a decoding agent's context moved: most agents stop at the first test
            if (v is None or v.context != a.context or v.generated != a.generated or v.state != state
                    or v.tail != a.tail or v.turns != a.turns or v.residency != a.residency.value
                    or v.limit != a.limit or v.label != a.label or v.reused != a.reused_tokens or v.miss != a.miss
                    or v.drafted != a.drafted or v.pending != len(a.pending) or v.ttft_s != a.ttft_s
                    or v.queue_s != a.queue_s):
                v = kept[a.id] = AgentView(a.id, a.context, state, a.limit, a.generated, a.turns, a.tail,
                                           a.residency.value, a.label, a.reused_tokens, a.miss, a.drafted,
                                           a.accepted, len(a.pending), a.queue_s, a.ttft_s)
            out.append(v)
        return out

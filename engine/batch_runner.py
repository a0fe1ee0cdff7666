"""Runs the scheduler's plan on the backend and hands the tokens back to their agents: a prefill chunk, a
decode batch (now and then one agent alone, the batch-1 reference), or a wait; tools that returned wake
their agents first. It changes agents and cells; the engine makes the step's record from what it returns."""

from collections.abc import Callable
from dataclasses import dataclass, field

from swarmtune.engine.agents.agent import Agent, AgentState, Residency
from swarmtune.engine.agents.agent_source import AgentSource
from swarmtune.engine.backends.backend import Backend, Landing, NoKVSlot, VerifyLanding
from swarmtune.engine.backends.clock import Clock
from swarmtune.engine.errors import Stalled
from swarmtune.engine.kv.residency import MoveLog, Parking
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.measure.analysis import REFERENCE_EVERY_MAX_STEPS, StepAnalysis
from swarmtune.engine.measure.stall_bound import StallBound
from swarmtune.engine.record.records import mean_context
from swarmtune.engine.scheduler import Plan
from swarmtune.engine.settings import EngineSettings
from swarmtune.engine.spec.drafts import Drafts
from swarmtune.engine.spec.mix_policy import MixPolicy


@dataclass
class Ran:
    """What one step did, for its record."""

    kind: str  # decode | prefill | idle | rebuild
    batch: list[Agent]  # the agents it served
    seconds: float  # the backend's (or, for a rebuild, the swarm's) seconds, moves not included
    tokens: int  # the tokens it carried
    preempted: list[int] = field(default_factory=list)  # agents whose cells it freed
    note: str = ""
    reference: bool = False  # a batch-1 step run to time the reference
    converted_tokens: int = 0  # a rebuild: cached tokens converted to the new KV type
    refused_kv: KVSetting | None = None  # a rebuild: the KV type this build could not make
    drafts: int = 0  # a decode: the agents that carried drafts
    drafted: int = 0  # a decode: the drafted tokens it verified
    accepted: int = 0  # of those, the ones its agents kept (in `tokens`)
    prefill_tokens: int = 0  # a decode: the prefill chunk it carried in the same call
    drafting_s: float = 0.0  # a decode: the draft model's seconds before it, in `seconds`


class BatchRunner:
    def __init__(self, backend: Backend, settings: EngineSettings, workload: AgentSource, clock: Clock,
                 analysis: StepAnalysis, moves: MoveLog, parking: Parking) -> None:
        self.backend = backend
        self.s = settings  # the engine's own, as they are now
        self.workload = workload
        self.clock = clock  # the engine's (a shadow's is set again when it resumes)
        self.analysis = analysis
        self.moves = moves
        self.parking = parking
        self.since_reference = 0  # decode steps since the last batch-1 reference step
        self.stall = StallBound(settings, analysis)
        self.drafts = Drafts(backend, lambda a: self.workload.turn_limit(a) - a.turn_generated)
        self.mix = MixPolicy(backend, settings, analysis)
        self.drafts.room = settings.draft_tokens  # the engine asked the backend for it before the first context
        if settings.draft_model:
            self.drafts.use_model(settings.draft_model)

    def run(self, plan: Plan, agents: list[Agent], step: int) -> Ran:
        """The plan, as step number `step`, after freeing what it preempts."""
        return self.start(plan, agents, step, launch=False)()

    def start(self, plan: Plan, agents: list[Agent], step: int, launch: bool) -> Callable[[], Ran]:
        """The plan begun: with launch, a decode step is on the device when this returns, and what it returns
        lands it (its tokens to their agents); any other step, or a decode without launch, runs in full
        when that is called. Preemptions happen here, before the step."""
        preempted = [a.id for a in plan.preempt or []]
        for a in plan.preempt or []:
            self.preempt(a, step)
        if plan.kind == "decode" and plan.agents and launch:
            return self._decode(plan, preempted, step, agents)
        return lambda: self._run(plan, preempted, step, agents)

    def _run(self, plan: Plan, preempted: list[int], step: int, agents: list[Agent]) -> Ran:
        if plan.kind == "prefill":
            return self._prefill(plan, preempted, step, agents)
        if plan.kind == "decode" and plan.agents:
            return self._decode(plan, preempted, step, agents)()
        if any(a.waiting for a in agents):
            return self._idle(agents)
        raise Stalled("no agent can run: the KV budget is too small for the swarm")

    def preempt(self, a: Agent, step: int) -> None:
        a.evicted_at = step
        if a.waiting:  # a waiting agent keeps waiting; its history is prefilled on return
            self.parking.drop(a)
            return
        self.moves.lose(a)
        self.backend.cells.drop(a.seq)
        a.preempted()

    def wake_tools(self, agents: list[Agent], now_s: float, room_tokens: Callable[[], int]) -> None:
        """Tool results that have arrived: the agent's history comes back (swapped in where the budget has
        room_tokens() left, or prefilled again with the result) and the result is queued for prefill."""
        for a in agents:
            if not a.due(now_s):
                continue
            if a.residency is Residency.HOST:
                self.parking.swap_in(a, room_tokens())
            a.woken()

    def sampled(self, a: Agent, tok: int, seconds: float, agents: list[Agent]) -> None:
        """A token just sampled for a (after its prefill or in a decode step): its turn goes on with it, or
        ends before it (an end of generation, the turn's limit, the context's, or its source says so)."""
        if not self.goes_on(a, tok):
            self.turn_ended(a, seconds, agents)

    def goes_on(self, a: Agent, tok: int) -> bool:
        """tok is a's next token, its turn going on; False: the turn ends before it."""
        source = self.workload
        if not (self.backend.text.is_eog(tok) or a.turn_generated >= source.turn_limit(a) or a.context + 2 >= a.limit):
            a.next_token = tok
            if source.on_token(a, tok, self.backend.text.piece(tok)):
                return True
        return False

    def turn_ended(self, a: Agent, seconds: float, agents: list[Agent]) -> None:
        a.next_token = None
        self.workload.end_turn(a, self.clock.after(seconds))
        if a.waiting:
            self.parking.park(a, agents)

    def _idle(self, agents: list[Agent]) -> Ran:
        """Every agent waits for a tool or a client: the clock runs to the first return (the sim's), or the
        engine waits a slice, less where work arrives (a request)."""
        ready = [a.tool_ready_at for a in agents if a.tool_ready_at is not None]
        note = "every agent waits for a tool" if ready else "every agent waits for its client"
        seconds = self.clock.idle(min(ready) if ready else None, self.workload.idle)
        return Ran("idle", [], seconds, 0, [], note=note)

    def _prefill(self, plan: Plan, preempted: list[int], step: int, agents: list[Agent]) -> Ran:
        a = plan.agents[0]
        try:
            n, note = self._next_chunk(plan.chunk, a, agents)
            chunk, pos0 = a.pending[:n], a.context
            seconds = self.backend.steps.prefill(a.seq, chunk, pos0)
            self.analysis.chunk_timed(self.s.kv, n, pos0, seconds)
            a.prefilled(n)
            self._paste_due(a)
        except NoKVSlot:
            self.preempt(a, step)
            return Ran("prefill", [], 0.0, 0, preempted + [a.id], note="no KV slot")
        self._chunk_served(a, step, seconds, agents)
        return Ran("prefill", [a], seconds, len(chunk), preempted, note=note)

    def _next_chunk(self, most: int, a: Agent, agents: list[Agent]) -> tuple[int, str]:
        """How many of a's pending tokens the next chunk ingests (and the record's note where a bound cut it)."""
        self._paste_due(a)  # a chunk right after what it kept (a removal) goes back before any prefill
        n = min(most, a.kept[0].at - a.context) if a.kept else most  # up to the next kept chunk
        return self.stall.cut(n, a.context, any(x.state is AgentState.DECODE for x in agents))

    def _chunk_served(self, a: Agent, step: int, seconds: float, agents: list[Agent]) -> None:
        """A chunk of a's is in: where it was the last, a's first token is drawn from its last row."""
        a.served(step)
        if not a.pending:
            a.ready()
            self.sampled(a, self.backend.steps.first_token_after_prefill(a.seq), seconds, agents)

    def _paste_due(self, a: Agent) -> None:
        """Kept chunks of its old cells whose place its prefill has reached go back
        (engine/conversation/chunk_reuse.py)."""
        while a.kept and a.kept[0].at == a.context:
            k = a.kept[0]
            seconds = self.backend.cells.paste(a.seq, k.handle, k.at)
            a.pasted()
            self.moves.add(a, "paste", int(self.backend.facts.bytes_model.kv_cache_bytes(self.s.kv, a.context)),
                           seconds, a.context)

    def _reference_due(self, batch: list[Agent], agents: list[Agent]) -> bool:
        if not self.s.reference:
            return False
        # while a prompt fills, one chunk runs between two decode steps: a reference step would make the others
        # wait through two chunks for their next token. It waits for the prefill to end (up to the longest
        # cadence: a swarm always filling still times its reference)
        if self.since_reference < REFERENCE_EVERY_MAX_STEPS and any(a.state is AgentState.PREFILL for a in agents):
            return False
        return self.analysis.reference_due(self.s.kv, [a.context for a in batch], self.since_reference)

    def _decode(self, plan: Plan, preempted: list[int], step: int, agents: list[Agent]) -> Callable[[], Ran]:
        """A decode step begun: a plain one, one that verifies drafts, or one that carries a prefill chunk
        (engine/spec/mix_policy.py); what it returns lands it."""
        batch, note = self._reference_or(plan.agents, agents)
        # drafts ride every decode step but a reference (its time is batch 1's without them)
        self.drafts.set_length(self.s.draft_tokens, self.s.draft_auto)
        self.drafts.spent_s = 0.0
        # a step that carries a prefill chunk (--mix) carries no drafts: the chunk, planned for it, would
        # otherwise wait, and be planned again, as long as drafts ride every step
        drafts = self.drafts.for_batch(batch, self.s.draft_tokens) \
            if self.s.draft_tokens and not note and plan.mixed is None else None
        # a prefill chunk rides a plain step: not a reference's (batch 1's own time) nor a verify step
        mixed = plan.mixed if not note and drafts is None else None
        while True:
            sent = [a.next_token for a in batch if a.next_token is not None]  # every agent batched has one
            try:
                landing, chunk = self._launch(batch, sent, drafts, mixed, plan.chunk, agents)
                break
            except NoKVSlot:
                if drafts is not None or mixed is not None:  # the cells drafts or a chunk needed: without first
                    drafts = mixed = None
                    continue
                victim = max(batch, key=lambda a: a.context)
                self.preempt(victim, step)
                preempted.append(victim.id)
                batch = [a for a in batch if a is not victim]
                if not batch:
                    return lambda: Ran("decode", [], 0.0, 0, preempted, note="no KV slot")
        drafting_s = self.drafts.spent_s  # a draft model's calls: the step's own seconds
        before = [a.context for a in batch]

        def landed() -> Ran:
            runs, seconds = landing()
            drafted = sum(len(d) for d in drafts) if drafts is not None else 0
            if chunk is None:
                self.drafts.observed(len(batch), seconds, drafted)
                if not note:  # a batch-1 reference step is not the swarm's
                    self.stall.decode_timed(seconds + drafting_s)
            else:
                self.mix.observed(seconds, batch, chunk[0], chunk[1])
            seconds += drafting_s
            accepted = self._hand_out(batch, sent, runs, drafts, before, seconds, step, agents)
            if chunk is not None and mixed is not None:
                mixed.prefilled(chunk[0])
                self._paste_due(mixed)
                self._chunk_served(mixed, step, seconds, agents)
            return Ran("decode", batch, seconds, len(batch) + accepted, preempted, note=chunk[2] if chunk else note,
                       reference=bool(note), drafts=sum(1 for d in drafts or [] if d),
                       drafted=drafted, accepted=accepted, prefill_tokens=chunk[0] if chunk else 0,
                       drafting_s=drafting_s)
        return landed

    def _reference_or(self, batch: list[Agent], agents: list[Agent]) -> tuple[list[Agent], str]:
        """The batch planned, or where a reference step is due, one agent alone (the others wait a step): a real
        step of the run, timed at batch 1, by the agent nearest the batch's mean context (where the next
        speedups will be read); and the record's note."""
        self.since_reference += 1
        note = ""
        if self._reference_due(batch, agents):
            mean_ctx = mean_context(a.context for a in batch)
            batch = [min(batch, key=lambda a: (abs(a.context - mean_ctx), a.last_served_step))]
            note = "batch-1 reference step"
        if len(batch) == 1 and (note or not self.s.draft_tokens):  # a step of one times batch 1 unless drafted
            self.since_reference = 0
        return batch, note

    def _launch(self, batch: list[Agent], sent: list[int], drafts: list[list[int]] | None, mixed: Agent | None,
                chunk: int, agents: list[Agent]) -> tuple[VerifyLanding, tuple[int, int, str] | None]:
        """The step on its way (NoKVSlot: refused): what lands it gives each agent's run of tokens, and where it
        carries a prefill chunk, (its tokens, its first position, the record's note)."""
        steps, seqs, positions = self.backend.steps, [a.seq for a in batch], [a.context for a in batch]
        if drafts is not None:
            return steps.launch_verify(seqs, sent, positions, drafts), None
        if mixed is None:
            return _runs(steps.launch_decode(seqs, sent, positions)), None
        n, note = self._next_chunk(chunk, mixed, agents)
        pos0 = mixed.context
        return _runs(steps.launch_mixed(seqs, sent, positions, mixed.seq, mixed.pending[:n], pos0)), (n, pos0, note)

    def _hand_out(self, batch: list[Agent], sent: list[int], runs: list[list[int]], drafts: list[list[int]] | None,
                  before: list[int], seconds: float, step: int, agents: list[Agent]) -> int:
        """The one place a decode step's tokens reach their agents: each is fed what it was sent, then takes its
        run (a plain step's one draw; a verify step's drafts its draws agreed with, then the draw after them),
        until its turn ends. The cells of drafts it did not keep (or kept past its turn's end) are removed.
        Returns the drafts kept."""
        accepted = 0
        for i, (a, fed, run) in enumerate(zip(batch, sent, runs, strict=True)):
            a.decoded(fed, step)
            ended = False
            for j, tok in enumerate(run):
                if not self.goes_on(a, tok):
                    ended = True
                    break
                if j < len(run) - 1:  # a draft kept: its cell is written, it is fed
                    a.decoded(tok, step)
            if drafts is not None:
                d, ctx0 = drafts[i], before[i]
                if ctx0 + 1 + len(d) > a.context:  # cells past its history: drafts rejected, or past the turn
                    self.backend.cells.truncate(a.seq, a.context)
                # the drafts it kept, not those its draws agreed with past its turn's end; counted before the
                # turn ends, so that its request counts them
                self.drafts.verified(a, len(d), a.context - ctx0 - 1)
                accepted += a.context - ctx0 - 1
            if ended:
                self.turn_ended(a, seconds, agents)
        return accepted


def _runs(landing: Landing) -> VerifyLanding:
    """A plain landing's one token per sequence, as runs of one."""
    def landed() -> tuple[list[list[int]], float]:
        out, seconds = landing()
        return [[t] for t in out], seconds
    return landed

"""Runs the scheduler's plan on the backend and hands the tokens back to their agents: a prefill chunk, a
decode batch (now and then one agent alone, the batch-1 reference), or a wait; tools that returned wake
their agents first. It changes agents and cells; the engine makes the step's record from what it returns."""

from collections.abc import Callable
from dataclasses import dataclass, field

from swarmtune.engine.agents.agent import Agent, AgentState, Residency
from swarmtune.engine.agents.agent_source import AgentSource
from swarmtune.engine.backends.backend import Backend, NoKVSlot
from swarmtune.engine.backends.clock import Clock
from swarmtune.engine.errors import Stalled
from swarmtune.engine.kv_types import KVSetting
from swarmtune.engine.measure.analysis import REFERENCE_EVERY_MAX_STEPS, StepAnalysis
from swarmtune.engine.mix_policy import MixPolicy
from swarmtune.engine.records import mean_context
from swarmtune.engine.residency import MoveLog, Parking
from swarmtune.engine.scheduler import Plan
from swarmtune.engine.settings import STALL_DECODE_STEPS, EngineSettings
from swarmtune.engine.spec.drafts import Drafts

MIN_CHUNK_TOKENS = 16  # a prefill under a stall bound still moves, even where one call costs more than the bound
PROBE_CHUNK_TOKENS = (16, 32, 64)


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
        self.probes = 0  # chunks cut to a stall bound before the chunk fit could size them
        self.decode_s: float | None = None  # the swarm's decode steps, measured (a moving mean): --max-stall-ms auto
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
        return self._within_stall(n, a, agents)

    def _chunk_served(self, a: Agent, step: int, seconds: float, agents: list[Agent]) -> None:
        """A chunk of a's is in: where it was the last, a's first token is drawn from its last row."""
        a.served(step)
        if not a.pending:
            a.ready()
            self.sampled(a, self.backend.steps.first_token_after_prefill(a.seq), seconds, agents)

    def _within_stall(self, n: int, a: Agent, agents: list[Agent]) -> tuple[int, str]:
        """A chunk of n tokens cut to the stall bound while other agents decode (what the run's timed chunks
        say fits in it, never under MIN_CHUNK_TOKENS), and the record's note when it was cut."""
        bound = self._stall_bound(a)
        if bound is None or not any(x.state is AgentState.DECODE for x in agents):
            return n, ""
        fits = self.analysis.chunk_within(self.s.kv, bound, a.context, n)
        # before a fit: small chunks of three sizes, so the fit can tell a call's cost from a token's
        cut = min(n, PROBE_CHUNK_TOKENS[self.probes % 3] if fits is None else max(fits, MIN_CHUNK_TOKENS))
        self.probes += fits is None
        return cut, (f"stall bound {bound * 1000:.0f} ms: {cut} of {n} tokens" if cut < n else "")

    def _stall_bound(self, a: Agent) -> float | None:
        """The stall bound for a's next chunk: the one stated, or under auto STALL_DECODE_STEPS times what each
        chunk adds to a's time to its first token: the decode step run after it, and the call's own cost at
        a's position (the fit's c + d·p), so that cutting a prompt into chunks costs it at most about 1/8 more.
        Where a call's own cost is small (a GPU, a short context) that is 8 decode steps; at 6k cells on a 2-core
        CPU, whole chunks."""
        if not self.s.stall_auto:
            return self.s.max_stall_s
        if self.decode_s is None:
            return None
        fit = self.analysis.chunk_fit(self.s.kv)
        return STALL_DECODE_STEPS * (self.decode_s + (fit.call_seconds(a.context) if fit is not None else 0.0))

    def _decode_timed(self, seconds: float) -> None:
        """A decode step of the swarm's (drafts verified or not, no prefill in it) took this long."""
        self.decode_s = seconds if self.decode_s is None else self.decode_s + 0.2 * (seconds - self.decode_s)

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
        batch = plan.agents
        note = ""
        self.since_reference += 1
        if self._reference_due(batch, agents):
            # one agent alone, the others wait a step: a real step of the run, timed at batch 1, by the
            # agent nearest the batch's mean context (where the next speedups will be read)
            mean_ctx = mean_context(a.context for a in batch)
            batch = [min(batch, key=lambda a: (abs(a.context - mean_ctx), a.last_served_step))]
            note = "batch-1 reference step"
        if len(batch) == 1 and (note or not self.s.draft_tokens):  # a step of one times batch 1 unless drafted
            self.since_reference = 0
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
            try:
                sent = [a.next_token for a in batch if a.next_token is not None]  # every agent batched has one
                if drafts is not None:
                    return self._verify(batch, sent, drafts, preempted, step, agents)
                if mixed is not None:
                    return self._mixed(batch, sent, mixed, plan.chunk, preempted, step, agents)
                landing = self.backend.steps.launch_decode([a.seq for a in batch], sent, [a.context for a in batch])
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

        drafting_s = self.drafts.spent_s  # a draft model's calls whose drafts were all too unsure to ride

        def landed() -> Ran:
            out, seconds = landing()
            self.drafts.observed(len(batch), seconds, 0)
            seconds += drafting_s
            if not note:  # a batch-1 reference step is not the swarm's
                self._decode_timed(seconds)
            for a, fed, tok in zip(batch, sent, out, strict=True):
                a.decoded(fed, step)
                self.sampled(a, tok, seconds, agents)
            return Ran("decode", batch, seconds, len(batch), preempted, note=note, reference=bool(note),
                       drafting_s=drafting_s)
        return landed

    def _mixed(self, batch: list[Agent], sent: list[int], a: Agent, chunk: int, preempted: list[int], step: int,
               agents: list[Agent]) -> Callable[[], Ran]:
        """A decode step that carries a's next prefill chunk in the same call (engine/mix_policy.py)."""
        n, note = self._next_chunk(chunk, a, agents)
        pos0 = a.context
        landing = self.backend.steps.launch_mixed([x.seq for x in batch], sent, [x.context for x in batch], a.seq,
                                            a.pending[:n], pos0)

        def landed() -> Ran:
            out, seconds = landing()
            self.mix.observed(seconds, batch, n, pos0)
            for x, fed, tok in zip(batch, sent, out, strict=True):
                x.decoded(fed, step)
                self.sampled(x, tok, seconds, agents)
            a.prefilled(n)
            self._paste_due(a)
            self._chunk_served(a, step, seconds, agents)
            return Ran("decode", batch, seconds, len(batch), preempted, note=note, prefill_tokens=n)
        return landed

    def _verify(self, batch: list[Agent], sent: list[int], drafts: list[list[int]], preempted: list[int],
                step: int, agents: list[Agent]) -> Callable[[], Ran]:
        """A decode step that verifies drafts: each agent keeps the drafts its own draws agreed with, then the
        draw after them; the cells of those it did not keep (or kept past its turn's end) are removed."""
        before = [a.context for a in batch]
        landing = self.backend.steps.launch_verify([a.seq for a in batch], sent, before, drafts)

        drafting_s = self.drafts.spent_s  # a draft model's calls: the step's own seconds

        def landed() -> Ran:
            kept, seconds = landing()
            self.drafts.observed(len(batch), seconds, sum(len(d) for d in drafts))
            seconds += drafting_s
            self._decode_timed(seconds)
            accepted = 0
            for a, fed, d, k, ctx0 in zip(batch, sent, drafts, kept, before, strict=True):
                a.decoded(fed, step)
                ended = False
                for i, tok in enumerate(k):
                    if not self.goes_on(a, tok):
                        ended = True
                        break
                    if i < len(k) - 1:  # a draft kept: its cell is written, it is fed
                        a.decoded(tok, step)
                if ctx0 + 1 + len(d) > a.context:  # cells past its history: drafts rejected, or past the turn
                    self.backend.cells.truncate(a.seq, a.context)
                # the drafts it kept, not those its draws agreed with past its turn's end; counted before the
                # turn ends, so that its request counts them
                self.drafts.verified(a, len(d), a.context - ctx0 - 1)
                accepted += a.context - ctx0 - 1
                if ended:
                    self.turn_ended(a, seconds, agents)
            return Ran("decode", batch, seconds, len(batch) + accepted, preempted, drafts=sum(1 for d in drafts if d),
                       drafted=sum(len(d) for d in drafts), accepted=accepted, drafting_s=drafting_s)
        return landed

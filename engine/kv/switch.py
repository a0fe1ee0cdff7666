"""A KV switch: the context rebuilt at another KV type (or with room for more streams). Before the old cache
closes every history is saved and converted to the new type; after the new one opens, those that fit go
back into it, and what neither applies to is prefilled again. A type this build cannot make is refused and
the old cache is made again: the swarm runs on as it was."""

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from swarmtune.engine.agents.agent import Agent, AgentState, Residency
from swarmtune.engine.backends.backend import Backend, NoKVSlot
from swarmtune.engine.batch_runner import BatchRunner, Ran
from swarmtune.engine.errors import Interrupted, UserError
from swarmtune.engine.kv.convert import Unconvertible
from swarmtune.engine.kv.residency import MoveLog
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.measure.analysis import StepAnalysis
from swarmtune.engine.settings import EngineSettings


@dataclass
class Converted:
    """Agent id -> its history converted to the new type, and -> the state as saved (in the old type, put
    back if the new cache cannot be made); why not, where conversion does not apply."""

    states: dict[int, object] = field(default_factory=dict)
    saved: dict[int, object] = field(default_factory=dict)
    why_not: str = ""


@dataclass
class Restored:
    """The agents whose histories went back (or stay swapped out, now in the new type), and the cost."""

    ids: set[int] = field(default_factory=set)
    seconds: float = 0.0
    cached_tokens: int = 0


def convert_histories(backend: Backend, agents: list[Agent], old: KVSetting, kv: KVSetting, allowed: bool,
                      moves: MoveLog) -> Converted:
    """Before the old cache closes: every cached history (and every swapped one) saved and converted to kv.
    A failure midway converts nothing (the old cache is still open)."""
    why = "off (--no-kv-convert)" if not allowed else backend.caps.converts(old, kv)
    if why is not None:
        return Converted(why_not=why)
    out = Converted()
    # on a real backend one history converts (ggml's routines, on their own threads and without the GIL)
    # while the next is saved (llama.cpp copying its rows): measured on the default model, 8 x 1,050
    # tokens f16 -> q8_0, each about 60 and 50 ms a sequence. The sim's conversion takes no wall time.
    overlap = backend.source != "simulated"
    t0 = time.perf_counter()
    converting: list[tuple[Agent, int, Future[tuple[object, float]]]] = []
    try:
        with ThreadPoolExecutor(1) as pool:
            for a in agents:
                if a.state is AgentState.PREEMPTED or not a.context:
                    continue
                if a.residency is Residency.HOST:
                    handle = a.swapped
                    nbytes = getattr(a.swapped, "nbytes", 0)
                elif a.residency is Residency.CACHE and a.seq < backend.n_seqs:
                    handle, nbytes, seconds = backend.cells.save_seq(a.seq)
                    out.saved[a.id] = handle
                    moves.add(a, "convert_save", nbytes, seconds)
                else:
                    continue
                if overlap:
                    converting.append((a, nbytes, pool.submit(backend.cells.convert_saved, handle, kv)))
                else:
                    out.states[a.id], seconds = backend.cells.convert_saved(handle, kv)
                    moves.add(a, "convert", nbytes, seconds)
            done = [(a, nbytes, *f.result()) for a, nbytes, f in converting]
    except Unconvertible as e:
        moves.forget("convert")
        return Converted(why_not=str(e))
    if done:
        # overlapped with the saves, the conversions' own seconds add up to more than they cost the swarm:
        # each gets its share of the wall time the saves left, so that the moves add up to the switch
        saves_s = moves.seconds("convert_save")
        left_s = max(time.perf_counter() - t0 - saves_s, 0.0)
        own_s = sum(seconds for *_, seconds in done) or 1.0
        for a, nbytes, handle, seconds in done:
            out.states[a.id] = handle
            moves.add(a, "convert", nbytes, seconds * left_s / own_s)
    return out


def restore_histories(backend: Backend, agents: list[Agent], states: dict[int, object], budget_tokens: int,
                      used_tokens: Callable[[list[Agent]], int]) -> Restored:
    """After the new cache opened: each converted history goes back into it, by agent id, while the budget
    holds it; a swapped one stays swapped, in the new type. The rest are prefilled again by the caller."""
    out = Restored()
    for a in sorted(agents, key=lambda x: x.id):
        handle = states.get(a.id)
        if handle is None:
            continue
        if a.residency is Residency.HOST:
            a.swapped = handle  # still swapped out, now in the new type
            out.ids.add(a.id)
            continue
        if used_tokens([x for x in agents if x.id in out.ids]) + a.context > budget_tokens:
            continue  # the smaller budget cannot hold it: prefilled (or preempted) by the caller
        try:
            out.seconds += backend.cells.restore_seq(a.seq, handle)
        except (NoKVSlot, Unconvertible):
            continue  # no room after all, or not the layout it was converted for: prefilled again
        out.ids.add(a.id)
        out.cached_tokens += a.context
    return out


class KVSwitch:
    def __init__(self, backend: Backend, settings: EngineSettings, analysis: StepAnalysis, moves: MoveLog,
                 runner: BatchRunner) -> None:
        self.backend = backend
        self.s = settings  # the engine's own: its KV type is set here, once the new cache is made
        self.analysis = analysis
        self.moves = moves
        self.runner = runner  # its clock, its agents' source and what a sampled token does

    def rebuild(self, kv: KVSetting, slots: int, agents: list[Agent], budget_tokens: Callable[[KVSetting], int],
                used_tokens: Callable[[list[Agent]], int], should_stop: Callable[[], bool],
                progress: Callable[[str, int, int], None]) -> Ran:
        """The context made again at kv with room for `slots` streams; every agent's history converted,
        or prefilled again, or (where the new budget cannot hold it) preempted. Ran.refused_kv: a type this
        build refused. The re-prefill reports its progress and stops where should_stop says."""
        old = self.s.kv
        for a in agents:
            a.fold_kept()  # cut from the old cache, in its type: prefilled instead
        t0 = time.perf_counter()
        refused, refused_kv = "", None
        conv = convert_histories(self.backend, agents, old, kv, self.s.kv_convert, self.moves) \
            if kv != old else Converted()
        converted = conv.states
        try:
            self.backend.open(kv, slots, self.s.ctx_per_agent)
        except UserError as e:  # this build cannot make that cache: keep running on the old one
            refused = f"{kv} refused ({e}); "
            refused_kv, kv = kv, old
            self.backend.open(kv, slots, self.s.ctx_per_agent)
            converted = conv.saved  # the states as saved go back into the old type's cache
            self.moves.forget("convert")
        self.s.kv = kv
        self.analysis.context_opened()
        budget = budget_tokens(kv)
        back = restore_histories(self.backend, agents, converted, budget, used_tokens)
        restored, restore_s, converted_tokens = back.ids, back.seconds, back.cached_tokens
        for a in agents:
            if a.waiting and a.residency is Residency.HOST and a.id not in restored and kv != old:
                a.evict()  # its saved rows are in the old cache's type: prefilled again when its tool returns
                self.moves.add(a, "swap_discarded", 0, 0.0)
        live = [a for a in agents if a.state is not AgentState.PREEMPTED and a.residency is Residency.CACHE
                and a.id not in restored]
        for a in agents:
            self.runner.workload.seed_sampler(a)
            if a not in live:
                continue
            if not a.history and not a.pending:
                self.runner.workload.start_task(a)  # an agent added beyond the old streams starts here
            a.requeue()
        seconds, done, preempted = self._prefill_again(live, agents, budget, used_tokens, should_stop, progress)
        moves_s = self.moves.seconds("convert")
        # the conversion's own seconds are in its moves
        wall = self.runner.clock.step_seconds(max(time.perf_counter() - t0 - moves_s, 0.0), seconds + restore_s)
        what = f"kv {old} -> {kv}" if kv != old or refused else f"room for {slots} agents"
        how = []
        if converted_tokens:
            how.append(f"converted {converted_tokens} cached tokens of {len(restored)} agents in place "
                       f"({moves_s + restore_s:.2f} s)")
        if done or not converted_tokens:
            how.append(f"re-prefilled {done} tokens" + (f" (no conversion: {conv.why_not})" if conv.why_not else ""))
        return Ran("rebuild", [], wall, done, preempted, converted_tokens=converted_tokens,
                   note=f"{refused}{what}: " + "; ".join(how) + f" in {wall + moves_s:.2f} s",
                   refused_kv=refused_kv)

    def _prefill_again(self, live: list[Agent], agents: list[Agent], budget: int,
                       used_tokens: Callable[[list[Agent]], int],
                       should_stop: Callable[[], bool],
                       progress: Callable[[str, int, int], None]) -> tuple[float, int, list[int]]:
        """The histories neither converted nor restored, prefilled again while the budget holds them."""
        total = sum(len(a.pending) for a in live)
        seconds, done = 0.0, 0
        preempted: list[int] = []
        self.backend.interrupt_with(should_stop)  # quitting stops even a chunk in progress
        try:
            for a in sorted(live, key=lambda x: x.id):
                if used_tokens(agents) + len(a.pending) > budget:
                    if a.waiting:
                        a.evict()  # it waits for its tool; its history is prefilled on return
                    else:
                        a.preempted()  # the smaller budget cannot hold it; readmitted later
                    preempted.append(a.id)
                    continue
                while a.pending:
                    if should_stop():
                        raise Interrupted()
                    chunk = a.pending[: self.s.chunk_tokens]
                    seconds += self.backend.steps.prefill(a.seq, chunk, a.context)
                    a.prefilled(len(chunk))
                    done += len(chunk)
                    progress("rebuild", done, total)
                if not a.waiting:  # a waiting agent samples after what it waits for
                    a.ready()
                    self.runner.sampled(a, self.backend.steps.first_token_after_prefill(a.seq), 0.0, agents)
        finally:
            self.backend.interrupt_with(None)
        return seconds, done, preempted

"""A KV switch's conversions: before the old cache closes every history is saved and converted to the new
type; after the new one opens, those that fit go back into it. What neither applies to is prefilled again
by the engine's rebuild (engine/engine.py)."""

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from swarmtune.engine.backend import Backend, NoKVSlot
from swarmtune.engine.kv_convert import Unconvertible
from swarmtune.engine.residency import MoveLog
from swarmtune.engine.workload import Agent, AgentState, Residency


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


def convert_histories(backend: Backend, agents: list[Agent], old: str, kv: str, allowed: bool,
                      moves: MoveLog) -> Converted:
    """Before the old cache closes: every cached history (and every swapped one) saved and converted to kv.
    A failure midway converts nothing (the old cache is still open)."""
    why = "off (--no-kv-convert)" if not allowed else backend.can_convert(old, kv)
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
                    handle, nbytes, seconds = backend.save_seq(a.seq)
                    out.saved[a.id] = handle
                    moves.add(a, "convert_save", nbytes, seconds)
                else:
                    continue
                if overlap:
                    converting.append((a, nbytes, pool.submit(backend.convert_saved, handle, kv)))
                else:
                    out.states[a.id], seconds = backend.convert_saved(handle, kv)
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
            out.seconds += backend.restore_seq(a.seq, handle)
        except (NoKVSlot, Unconvertible):
            continue  # no room after all, or not the layout it was converted for: prefilled again
        out.ids.add(a.id)
        out.cached_tokens += a.context
    return out

"""Reuse past a divergence (engine/conversation/chunk_reuse.py, engine/kv/splice.py): which old cells a
changed prompt keeps, that the engine puts them back where the prompt has them, and (on the real model) that
the cache it builds continues the prompt almost as a full prefill does, while a wiped one does not."""

import pytest

from swarmtune.engine.agents.served import ServedAgents
from swarmtune.engine.backends.sim_backend import SimBackend
from swarmtune.engine.control import Control
from swarmtune.engine.conversation.chunk_reuse import MAX_INSERTED, Chunk, KeptChunk, plan, unfold
from swarmtune.engine.engine import Engine
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.model.profiles import profile
from swarmtune.engine.settings import EngineSettings
from tests.conftest import SIM
from tests.test_cache_integrity import _kl_nats
from tests.test_served import ask, run

KV = KVSetting.parse  # a KV setting as a flag spells it

OLD = list(range(1000, 1300))


def test_a_replaced_value_keeps_everything_after_it():
    new = OLD[:10] + [7, 8, 9] + OLD[12:]  # two tokens became three
    assert plan(OLD, new, 10, 16) == [Chunk(12, 13, len(OLD) - 12 - 1)]


def test_a_removal_and_an_insertion_each_keep_the_rest_shifted():
    removed = OLD[:50] + OLD[80:]
    assert plan(OLD, removed, 50, 16) == [Chunk(80, 50, len(OLD) - 80 - 1)]
    inserted = OLD[:50] + [5] * 20 + OLD[50:]
    assert plan(OLD, inserted, 50, 16) == [Chunk(50, 70, len(OLD) - 50 - 1)]


def test_a_chunk_is_not_moved_past_more_new_tokens_than_it_could_miss():
    # a whole new exchange inserted before the rest: those cells never attended it, so they are prefilled
    assert plan(OLD, OLD[:50] + [5] * (MAX_INSERTED + 1) + OLD[50:], 50, 16) == []
    assert plan(OLD, OLD[:50] + [5] * MAX_INSERTED + OLD[50:], 50, 16) != []


def test_a_moved_reminder_keeps_both_sides_in_order():
    reminder = list(range(1, 41))
    held = OLD[:100] + reminder + OLD[100:200]
    prompt = OLD[:100] + OLD[100:200] + reminder + [2000, 2001]
    # the history after the reminder comes first; the reminder itself came before it, so it is prefilled:
    # chunks keep their order
    assert plan(held, prompt, 100, 16) == [Chunk(140, 100, 100)]


def test_short_runs_the_last_token_and_off():
    new = OLD[:10] + [1] + OLD[11:40] + [2] + OLD[41:]
    chunks = plan(OLD, new, 10, 16)
    assert [c.tokens for c in chunks] == [29, len(OLD) - 41 - 1]  # each run from its own place
    assert all(c.prompt_at + c.tokens <= len(new) - 1 for c in chunks)  # the last token is prefilled
    assert plan(OLD, new, 10, 30) == [Chunk(41, 41, len(OLD) - 41 - 1)]  # the 29-token run is too short
    assert plan(OLD, new, 10, 0) == []


def test_a_repetitive_history_is_planned_quickly():
    held = [1, 2, 3, 4] * 2000
    prompt = [9] + held
    chunks = plan(held, prompt, 0, 64)
    assert chunks and chunks[0].prompt_at == 1 and sum(c.tokens for c in chunks) == len(held) - 1


def test_unfold_puts_the_kept_tokens_back_in_their_places():
    kept = [KeptChunk(13, (20, 21, 22), None), KeptChunk(20, (30,), None)]
    # history 10 long, then 3 to prefill, the first chunk, 4 more, the second, then 2
    assert unfold(10, [1, 2, 3, 4, 5, 6, 7, 8, 9], kept) == [1, 2, 3, 20, 21, 22, 4, 5, 6, 7, 30, 8, 9]


def make(cache_reuse: int, agents: int = 1) -> tuple[Engine, ServedAgents]:
    backend = SimBackend(profile(SIM))
    served = ServedAgents(backend, cache_reuse=cache_reuse)
    e = Engine(backend, EngineSettings(agents=agents, batch_cap=agents, ctx_per_agent=4096, check=True,
                                       reference=False, chunk_tokens=64), agents=served)
    return e, served


STEPS: list = []  # the last turn's step records


def turn(e: Engine, served: ServedAgents, prompt: list[int]):
    r, c = ask(e, served, prompt, max_tokens=4)
    STEPS.clear()
    while c.done is None and len(STEPS) < 2000:
        STEPS.append(e.step())
    return r, served.drain_records()[-1]


def header_turns(e: Engine, served: ServedAgents) -> tuple[list[int], list[int]]:
    body = e.backend.text.tokenize("user: the parser drops the last field of a quoted row; find out why " * 12)
    first = e.backend.text.tokenize("system: billing cch=0a1b; you are a coding agent. ") + body
    turn(e, served, first)
    again = e.backend.text.tokenize("system: billing cch=9z8y7x; you are a coding agent. ") + body
    return first, again


def test_a_changed_header_prefills_its_own_tokens_and_the_engine_puts_the_rest_back():
    e, served = make(cache_reuse=32)
    first, again = header_turns(e, served)
    r, rec = turn(e, served, again)
    at = next(i for i, (x, y) in enumerate(zip(first, again, strict=False)) if x != y)
    assert rec.shifted_tokens > len(again) - 20 and rec.prefilled_tokens < 12
    assert rec.cached_tokens == at + rec.shifted_tokens == len(again) - rec.prefilled_tokens
    assert "kept, shifted into place" in rec.miss_words and rec.miss_at == at
    agent = next(a for a in e.agents if a.id == r.agent)
    assert agent.history[: len(again)] == again and not agent.kept  # the check ran after every step, too
    assert any(m.op == "paste" for s in STEPS for m in s.moved)


def test_with_reuse_off_everything_after_the_header_is_prefilled():
    e, served = make(cache_reuse=0)
    first, again = header_turns(e, served)
    _, rec = turn(e, served, again)
    assert rec.shifted_tokens == 0 and rec.prefilled_tokens > len(again) - 20


def test_a_kv_switch_before_the_chunks_are_back_prefills_them_instead():
    e, served = make(cache_reuse=32)
    first, again = header_turns(e, served)
    # a header that grew by more than a prefill chunk: the first step does not reach the kept chunk
    header = "system: billing cch=" + "9z8y7x " * 40 + "; you are a coding agent. "
    again = e.backend.text.tokenize(header) + first[-150:]
    r, c = ask(e, served, again, max_tokens=4)
    e.step()  # the request reaches its agent: chunks cut, not yet pasted
    agent = next(a for a in e.agents if a.id == r.agent)
    assert agent.kept
    e.request(Control(kv=KV("q8_0")))
    run(e, lambda: c.done is not None)
    assert agent.history[: len(again)] == again and not agent.kept


@pytest.mark.model
def test_kept_cells_continue_the_prompt_as_a_full_prefill_does(llama_backend, fresh):
    b = llama_backend
    text = "def parse(row):\n    fields = row.split(',')\n    return [f.strip() for f in fields]\n" * 14
    old = b.text.tokenize(b.text.chat([{"role": "system", "content": "cch=0a1b2c; you are a coding agent"},
                             {"role": "user", "content": text}], add_assistant=True))
    new = b.text.tokenize(b.text.chat([{"role": "system", "content": "cch=9z8y7x6w5v; you are a coding agent"},
                             {"role": "user", "content": text}], add_assistant=True))
    keep = next(i for i, (x, y) in enumerate(zip(old, new, strict=False)) if x != y)
    chunks = plan(old, new, keep, 64)
    assert len(chunks) == 1 and chunks[0].shift > 0  # the value grew: its chunk moves up
    b.open(KV("f16"), 2, 2048)
    for i in range(0, len(old), b.max_chunk_tokens):
        b.steps.prefill(0, old[i : i + b.max_chunk_tokens], i)
    (kept,) = b.cells.cut(0, keep, chunks)
    c = chunks[0]
    b.steps.prefill(0, new[keep : c.prompt_at], keep)
    b.cells.paste(0, kept, c.prompt_at)
    end = c.prompt_at + c.tokens
    if end < len(new) - 1:
        b.steps.prefill(0, new[end:-1], end)
    assert b.cells.span(0) == (0, len(new) - 2)
    got = b.steps.next_logits(0, new[-1], len(new) - 1)
    fresh.open(KV("f16"), 1, 2048)
    for i in range(0, len(new) - 1, fresh.max_chunk_tokens):
        fresh.steps.prefill(0, new[i : min(i + fresh.max_chunk_tokens, len(new) - 1)], i)
    want = fresh.steps.next_logits(0, new[-1], len(new) - 1)
    fresh.open(KV("f16"), 1, 2048)
    wiped = fresh.steps.next_logits(0, new[-1], 0)
    kl, kl_wiped = _kl_nats(got, want), _kl_nats(wiped, want)
    print(f"kept {c.tokens} of {len(new)} tokens: KL {kl:.5f} nats against a full prefill (wiped: {kl_wiped:.3f})")
    assert kl < 0.05 and kl_wiped > 1.0



def test_a_chunk_whose_paste_costs_more_than_its_prefill_is_prefilled():
    e, served = make(cache_reuse=32)
    first, again = header_turns(e, served)  # its prefill steps measured the prefill rate
    assert served.reuse.prefill_s_per_token is not None
    served.reuse.paste_s_per_cell = served.reuse.prefill_s_per_token * 10  # as on a card whose host link is slow
    _, rec = turn(e, served, again)
    assert rec.shifted_tokens == 0 and rec.prefilled_tokens > len(again) - 20


def parent_after_subagents(lru: bool):
    """A parent's two turns, then three sub-agents with its system prompt on a 3-agent server (the third
    must displace someone), then the parent's next turn: its record."""
    e, served = make(cache_reuse=32, agents=3)
    if lru:  # the least-recent rule, for the contrast
        served._victim = lambda free: min(free, key=lambda a: (served.conversations.of(a.id).last_used or 0.0, a.id))
    tok = e.backend.text.tokenize
    system = tok("system: you are a coding agent; tools: read, grep, edit, run the tests. " * 6)
    r, _ = turn(e, served, system + tok("user: migrate the config loader to the settings API. " * 8))
    parent = next(a for a in e.agents if a.id == r.agent)
    _, rec = turn(e, served, parent.history + tok(" tool: config.py defines load_config and three callers. " * 4))
    for i in range(3):
        turn(e, served, system + tok(f"user: sub-agent {i}: list the callers of load_config in part {i}."))
    return turn(e, served, parent.history + tok(" tool: the sub-agents found seven callers. " * 3)), rec


def test_a_burst_of_subagents_leaves_the_parents_cells_where_lru_would_not():
    (r, rec), before = parent_after_subagents(lru=False)
    assert rec.cached_tokens >= before.prompt_tokens and rec.miss_cause in ("", "reply")
    (r, rec), before = parent_after_subagents(lru=True)
    assert rec.cached_tokens < before.prompt_tokens / 2  # the parent was the least recently used: displaced


@pytest.mark.model
def test_two_chunks_back_to_back_are_each_where_the_prompt_has_them(llama_backend, fresh):
    """A replaced value, then a removal between two kept runs: the second chunk is pasted right after the
    first, with no decode between them (the first one's shift must be in its K before the state is saved)."""
    b = llama_backend
    words = [b.text.tokenize(f" step {i}: read module_{i}.py, then run its tests and note what failed.")
             for i in range(40)]
    old = b.text.tokenize("cch=0a1b2c;") + sum(words, [])
    new = b.text.tokenize("cch=9z8y7x6w;") + sum(words[:20] + words[24:], []) + b.text.tokenize(" next")
    keep = next(i for i, (x, y) in enumerate(zip(old, new, strict=False)) if x != y)
    chunks = plan(old, new, keep, 16)
    assert len(chunks) == 2 and chunks[1].prompt_at == chunks[0].prompt_at + chunks[0].tokens
    b.open(KV("f16"), 1, 2048)
    for i in range(0, len(old), b.max_chunk_tokens):
        b.steps.prefill(0, old[i : i + b.max_chunk_tokens], i)
    kept = b.cells.cut(0, keep, chunks)
    if chunks[0].prompt_at > keep:
        b.steps.prefill(0, new[keep : chunks[0].prompt_at], keep)
    for c, k in zip(chunks, kept, strict=True):
        b.cells.paste(0, k, c.prompt_at)
    end = chunks[1].prompt_at + chunks[1].tokens
    if end < len(new) - 1:
        b.steps.prefill(0, new[end:-1], end)
    got = b.steps.next_logits(0, new[-1], len(new) - 1)
    fresh.open(KV("f16"), 1, 2048)
    for i in range(0, len(new) - 1, fresh.max_chunk_tokens):
        fresh.steps.prefill(0, new[i : min(i + fresh.max_chunk_tokens, len(new) - 1)], i)
    want = fresh.steps.next_logits(0, new[-1], len(new) - 1)
    kl = _kl_nats(got, want)
    print(f"two chunks ({chunks[0].tokens} + {chunks[1].tokens} tokens): KL {kl:.5f} nats against a full prefill")
    assert kl < 0.05

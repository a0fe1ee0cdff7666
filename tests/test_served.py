"""Served agents without HTTP: requests handed to the engine's source directly, on the sim backend
(fast) — which agent a conversation lands on, what its cache keeps, what a client sees of its text."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmtune.engine.agents.served import ServedAgents
from swarmtune.engine.agents.served_request import Busy, Delta, Finished, ServedRequest
from swarmtune.engine.backends.sim_backend import SimBackend
from swarmtune.engine.control import Control
from swarmtune.engine.conversation.sampling import SamplingParams
from swarmtune.engine.conversation.text_stream import TextStream
from swarmtune.engine.engine import Engine
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.model.profiles import profile
from swarmtune.engine.settings import EngineSettings
from tests.conftest import SIM

KV = KVSetting.parse  # a KV setting as a flag spells it


# the text a client sees
@given(st.text(min_size=0, max_size=60), st.lists(st.text(min_size=1, max_size=4), max_size=3),
       st.lists(st.integers(min_value=1, max_value=7), min_size=1, max_size=30))
@settings(max_examples=300, deadline=None)
def test_a_stream_never_splits_a_character_nor_shows_a_stop(text, stops, cuts):
    data = text.encode("utf-8")
    ts = TextStream(tuple(stops))
    sent, i, k = [], 0, 0
    while i < len(data):
        n = cuts[k % len(cuts)]
        sent.append(ts.feed(data[i : i + n]))
        i, k = i + n, k + 1
        if ts.stopped:
            break
    sent.append(ts.finish())
    # the stream stops at the first token after which the text so far holds a stop (as llama.cpp's server
    # does: where stops overlap, "0" in "10" before "100" completes), cut where the earliest stop found begins
    want, b, k = text, 0, 0
    while b < len(data):
        b, k = b + cuts[k % len(cuts)], k + 1
        so_far = data[:b].decode("utf-8", errors="ignore")  # whole characters only, as the stream holds the rest
        found = [j for j in (so_far.find(s) for s in stops) if j >= 0]
        if found:
            want = so_far[: min(found)]
            break
    assert "".join(sent) == want  # nothing of a stop, nothing after it, every character whole
    assert all("\ufffd" not in s for s in sent)


def test_a_stop_split_over_tokens_is_held_then_cut():
    ts = TextStream(("</end>",))
    assert ts.feed(b"hello </e") == "hello "
    assert ts.feed(b"nd> more") == "" and ts.stopped
    ts = TextStream(("</end>",))
    assert ts.feed(b"a </e") == "a " and ts.feed(b"x") == "</ex"  # not a stop after all: shown


def test_overlapping_stops_cut_at_the_first_one_the_tokens_complete():
    # hypothesis found it: "100" begins first, but with "1" and "0" as tokens, "0" completes first
    ts = TextStream(("0", "100"))
    assert ts.feed(b"1") == "" and ts.feed(b"0") == "1" and ts.matched == "0"
    ts = TextStream(("0", "100"))
    assert ts.feed(b"100") == "" and ts.matched == "100"  # one token: both are there, the earlier one cuts


def test_a_character_split_over_tokens_waits_for_its_last_byte():
    ts = TextStream()
    snake = "🐍".encode()
    assert ts.feed(snake[:2]) == "" and ts.feed(snake[2:]) == "🐍"


# which agent, which cells
def make(agents: int = 3, max_queue: int = 4, ctx: int = 4096) -> tuple[Engine, ServedAgents]:
    p = profile(SIM)
    backend = SimBackend(p)
    served = ServedAgents(backend, max_queue=max_queue)
    e = Engine(backend, EngineSettings(agents=agents, batch_cap=agents, ctx_per_agent=ctx, check=True,
                                       reference=False), agents=served)
    return e, served


class Client:
    def __init__(self) -> None:
        self.text, self.done = "", None

    def __call__(self, ev: Delta | Finished) -> None:
        if isinstance(ev, Delta):
            self.text += ev.text
        else:
            self.done = ev


def ask(e: Engine, served: ServedAgents, prompt: list[int], max_tokens: int = 8, key: str | None = None,
        seed: int = 1) -> tuple[ServedRequest, Client]:
    c = Client()
    r = ServedRequest(prompt=list(prompt), max_tokens=max_tokens, params=SamplingParams(seed=seed), key=key, emit=c)
    served.submit(r)
    return r, c


def run(e: Engine, until, steps: int = 2000) -> None:
    for _ in range(steps):
        if until():
            return
        e.step()
    raise AssertionError("did not finish")


def toks(e: Engine, text: str) -> list[int]:
    return e.backend.text.tokenize(text)


def test_a_returning_turn_reuses_its_cells_and_prefills_only_the_suffix():
    e, served = make()
    first = toks(e, "system: you are an agent. user: fix the bug in parser.py please " * 3)
    r1, c1 = ask(e, served, first)
    run(e, lambda: c1.done is not None)
    assert c1.done.reason == "length" and c1.done.usage.cached_tokens == 0 and c1.done.usage.completion_tokens == 8
    agent = next(a for a in e.agents if a.id == r1.agent)
    second = agent.history + toks(e, " tool: 3 tests failed, look at line 12 of the parser " * 2)
    r2, c2 = ask(e, served, second)
    run(e, lambda: c2.done is not None)
    assert r2.agent == r1.agent  # the same conversation, the same agent
    assert c2.done.usage.cached_tokens == r2.cached_tokens
    assert r2.cached_tokens == len(second) - r2.prefilled_tokens
    assert r2.cached_tokens >= len(first)  # the whole first prompt, and what it generated
    recs = served.drain_records()
    assert [x.cached_tokens for x in recs] == [0, r2.cached_tokens]
    assert recs[1].prefilled_tokens == len(second) - r2.cached_tokens


def test_an_edited_conversation_keeps_the_common_prefix_only():
    e, served = make()
    base = toks(e, "system: agent. user: read the file main.py and tell me what it does " * 4)
    r1, c1 = ask(e, served, base)
    run(e, lambda: c1.done is not None)
    edited = base[: len(base) * 3 // 4] + toks(e, " user: never mind, read util.py")
    r2, c2 = ask(e, served, edited)
    run(e, lambda: c2.done is not None)
    assert r2.cached_tokens == len(base) * 3 // 4  # copied
    assert next(a for a in e.agents if a.id == r1.agent).context >= len(base)  # the original stays whole
    e.check_caches()


def test_an_edit_that_must_displace_its_own_conversation_truncates_it():
    e, served = make(agents=1)
    base = toks(e, "system: agent. user: read the file main.py and tell me what it does " * 4)
    r1, c1 = ask(e, served, base)
    run(e, lambda: c1.done is not None)
    edited = base[: len(base) // 2] + toks(e, " user: never mind")
    r2, c2 = ask(e, served, edited)
    run(e, lambda: c2.done is not None)
    assert r2.agent == r1.agent and r2.cached_tokens == len(base) // 2
    e.check_caches()


def test_a_new_conversation_takes_a_free_agent_then_displaces_the_least_recently_used():
    e, served = make(agents=2)
    done = []
    for text in ("alpha " * 40, "bravo " * 40, "charlie " * 40):
        r, c = ask(e, served, toks(e, text))
        run(e, lambda c=c: c.done is not None)
        done.append(r)
    assert done[0].agent != done[1].agent
    assert done[2].agent == done[0].agent  # the least recently used of two
    assert done[2].cached_tokens == 0


def test_a_shared_system_prompt_is_copied_from_the_agent_that_holds_it():
    e, served = make()
    system = toks(e, "system: you are a careful coding agent with these tools: read, write, run. " * 3)
    r1, c1 = ask(e, served, system + toks(e, "user: task one"))
    run(e, lambda: c1.done is not None)
    r2, c2 = ask(e, served, system + toks(e, "user: a different task entirely, number two"))
    run(e, lambda: c2.done is not None)
    assert r2.agent != r1.agent
    assert r2.cached_tokens >= len(system)  # copied, not prefilled
    e.check_caches()


def test_a_pinned_key_keeps_its_agent():
    e, served = make()
    r1, c1 = ask(e, served, toks(e, "one " * 50), key="main")
    run(e, lambda: c1.done is not None)
    r2, c2 = ask(e, served, toks(e, "something else entirely " * 10), key="main")
    run(e, lambda: c2.done is not None)
    assert r2.agent == r1.agent
    assert next(a for a in e.agents if a.id == r1.agent).label == "main"


def test_a_full_queue_is_busy_and_a_cancelled_request_frees_its_agent():
    e, served = make(agents=1, max_queue=2)
    r1, c1 = ask(e, served, toks(e, "long one " * 30), max_tokens=500)
    ask(e, served, toks(e, "queued " * 30))
    with pytest.raises(Busy):
        ask(e, served, toks(e, "queued too " * 30))
        ask(e, served, toks(e, "and this " * 30))
    run(e, lambda: r1.completion_tokens >= 3)
    served.cancel(r1)
    e.step()
    assert c1.done is not None and c1.done.reason == "cancelled"
    assert c1.done.usage.completion_tokens < 500
    e.check_caches()


def test_a_burst_before_the_first_step_is_admitted_up_to_the_free_agents_and_the_queue():
    # the engine started, no step yet (a server just up): one free agent and a queue of one hold two
    e, served = make(agents=1, max_queue=1)
    e.start()
    ask(e, served, toks(e, "first " * 20))
    ask(e, served, toks(e, "second " * 20))
    with pytest.raises(Busy):
        ask(e, served, toks(e, "third " * 20))


def test_a_kv_switch_mid_stream_loses_and_repeats_no_token():
    e, served = make(agents=4)
    clients = [ask(e, served, toks(e, f"agent {i} works on task {i} " * 12), max_tokens=40, seed=i) for i in range(4)]
    run(e, lambda: all(r.completion_tokens >= 5 for r, _ in clients))
    e.request(Control(kv=KV("q8_0")))
    run(e, lambda: all(c.done is not None for _, c in clients))
    for r, c in clients:
        assert c.done.usage.completion_tokens == 40
        assert c.text == "".join(e.backend.text.piece(t) for t in r.generated)  # what it sent, each token once
    e.check_caches()


def test_fewer_agents_moves_a_request_on_without_repeating_a_token():
    e, served = make(agents=3)
    clients = [ask(e, served, toks(e, f"task {i} " * 30), max_tokens=30, seed=i) for i in range(3)]
    run(e, lambda: all(r.completion_tokens >= 4 for r, _ in clients))
    e.request(Control(agents=2))
    run(e, lambda: all(c.done is not None for _, c in clients))
    for r, c in clients:
        assert c.done.usage.completion_tokens == 30
        assert c.text == "".join(e.backend.text.piece(t) for t in r.generated)


def test_a_reply_rendered_back_in_other_tokens_still_continues_its_agent():
    e, served = make(agents=2)
    first = toks(e, "system: agent. user: explain the scheduler in three sentences " * 3)
    r1, c1 = ask(e, served, first, max_tokens=12)
    run(e, lambda: c1.done is not None)
    r0, c0 = ask(e, served, toks(e, "another conversation entirely " * 8))  # the other agent is taken
    run(e, lambda: c0.done is not None)
    # the client renders the reply back as text, which tokenizes otherwise from its fourth token on
    reply = r1.generated[:3] + toks(e, " [the rest of the reply, as the client re-rendered it]")
    second = first + reply + toks(e, " user: and now the KV cache")
    r2, c2 = ask(e, served, second)
    run(e, lambda: c2.done is not None)
    assert r2.agent == r1.agent and r2.cached_tokens == len(first) + 3
    assert next(a for a in e.agents if a.id == r0.agent).context >= r0.prompt_tokens  # nobody else displaced
    e.check_caches()


def test_the_tuner_forecasts_served_traffic_without_waiting_for_clients():
    import time

    from swarmtune.engine.tune.goal import Goal
    from swarmtune.engine.tune.tuner import Tuner

    p = profile(SIM)
    backend = SimBackend(p)
    served = ServedAgents(backend)
    tuner = Tuner(Goal(allowed_kv=(KV("f16"), KV("q8_0")), forecast_seeds=1, run_s=60.0))
    e = Engine(backend, EngineSettings(agents=4, batch_cap=4, ctx_per_agent=4096, reference=False),
               agents=served, tuner=tuner, autotune=True)
    for turn in range(8):
        clients = [ask(e, served, toks(e, f"conversation {i} " * 20 + " more" * (12 * turn)), max_tokens=48, seed=i)
                   for i in range(4)]
        run(e, lambda clients=clients: all(c.done is not None for _, c in clients), steps=5000)
    shape = served.traffic()
    assert shape is not None and (e.s.gen_tokens, e.s.tool_tokens) == (shape.gen_tokens, shape.tool_tokens)
    assert 0.8 * 48 <= shape.gen_tokens <= 1.25 * 48  # a reply's 48 tokens, to the traffic's steps of 25%
    t0 = time.perf_counter()
    runs = tuner.forecast(e, tuner.setting(e))  # every agent waits for its client now: the shadow's come back
    assert runs and all(r[-1].tokens > 0 for r in runs)
    assert time.perf_counter() - t0 < 10  # it never sleeps on a client that a shadow cannot have


def test_a_requests_latency_parts_add_up_to_its_wall_time():
    """queue + prefill time is its time to first token, and with its inter-token latency times the gaps, its
    wall time within 5% (what is left: the step that sent its last token ending it). On the sim's paced
    steps, so that the wall times are a device's."""
    e, served = make(agents=2)
    e.backend.paced = True  # type: ignore[attr-defined]
    recs = []
    served.on_finish = lambda req, rec: recs.append(rec)
    prompts = [toks(e, f"Question {i}: " + "words of a prompt " * 40) for i in range(4)]  # two wait in the queue
    done = [ask(e, served, p, max_tokens=24, seed=i)[1] for i, p in enumerate(prompts)]
    run(e, lambda: all(c.done is not None for c in done))
    assert len(recs) == 4 and any(r.queue_s > 0.05 for r in recs)
    for r in recs:
        assert r.ttft_s is not None and r.prefill_time_s is not None and r.itl_s is not None
        assert r.queue_s + r.prefill_time_s == pytest.approx(r.ttft_s, abs=2e-6)
        assert r.itl_max_s is not None and r.itl_max_s >= r.itl_s > 0
        assert r.ttft_s + r.itl_s * (r.completion_tokens - 1) == pytest.approx(r.e2e_s, rel=0.05)


def test_the_steps_carry_each_ended_requests_latency_and_each_agents_live_wait():
    """What the dashboard folds reaches it with the steps: the requests that ended in a step, the figures of
    their records, and each serving agent's queue wait and first token while its request runs."""
    from swarmtune.engine.record.records import step_from_dict

    e, served = make(agents=2)
    recs, ended, views = [], [], []
    served.on_finish = lambda req, rec: recs.append(rec)
    prompts = [toks(e, f"Question {i}: " + "words of a prompt " * 40) for i in range(4)]  # two wait in the queue
    done = [ask(e, served, p, max_tokens=12, seed=i)[1] for i, p in enumerate(prompts)]
    for _ in range(2000):
        if all(c.done is not None for c in done):
            break
        r = e.step()
        r = step_from_dict(json.loads(r.to_json()))  # as a recording or the API hands it on
        ended += r.ended
        views += [a for a in r.agents if a.queue_s is not None]
    by_id = {r.id: r for r in recs}
    assert sorted(q.id for q in ended) == sorted(by_id)
    for q in ended:
        r = by_id[q.id]
        assert (q.agent, q.queue_s, q.prefill_time_s, q.ttft_s, q.itl_s, q.itl_max_s, q.e2e_s,
                q.completion_tokens) == (r.agent, r.queue_s, r.prefill_time_s, r.ttft_s, r.itl_s, r.itl_max_s,
                                         r.e2e_s, r.completion_tokens)
    assert {v.queue_s for v in views} >= {r.queue_s for r in recs}  # each request's wait, on its agent's row
    assert {v.ttft_s for v in views if v.ttft_s is not None} == {r.ttft_s for r in recs}

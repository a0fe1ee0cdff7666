"""What each served request cost and why it lost its cache (engine/conversation/cache_miss.py,
engine/measure/energy_share.py), on the sim backend: the first position it did not reuse, the text there and
the cause in words; its steps' seconds and its share of their energy."""

from swarmtune.engine.agents.agent import Residency
from swarmtune.engine.agents.served import ServedAgents
from swarmtune.engine.backends.sim_backend import SimBackend
from swarmtune.engine.conversation.cache_miss import diverged
from swarmtune.engine.conversation.token_hashes import common_prefix
from swarmtune.engine.engine import Engine
from swarmtune.engine.measure.energy_share import joules_by_agent
from swarmtune.engine.measure.power.meter import make_meter
from swarmtune.engine.model.profiles import profile
from swarmtune.engine.record.records import AgentView, StepRecord
from swarmtune.engine.settings import EngineSettings
from tests.conftest import SIM
from tests.test_served import ask, make, run, toks

SYSTEM = "system: you are a careful coding agent. tools: read, write, run the tests. "


def served_turn(e, served, prompt, **kw):
    r, c = ask(e, served, prompt, **kw)
    run(e, lambda: c.done is not None)
    return r, served.drain_records()[-1]


def text(tokens):
    return " ".join(map(str, tokens))


def test_each_shape_of_edit_gets_its_cause():
    held = list(range(100))
    # the system prompt (its first 30 tokens) changed at 10
    m = diverged(held, held[:10] + [900, 901] + held[12:], 10, 30, text)
    assert m.cause == "system" and m.at == 10 and m.old.startswith("10 11") and m.new.startswith("900 901")
    # 20 tokens removed at 40: what follows them comes again, earlier
    m = diverged(held, held[:40] + held[60:], 40, 30, text)
    assert m.cause == "trimmed" and "20 tokens were removed at token 40" in m.words
    # 5 tokens inserted at 50 (a reminder moved in)
    m = diverged(held, held[:50] + [7000 + i for i in range(5)] + held[50:], 50, 30, text)
    assert m.cause == "inserted" and "5 tokens were inserted at token 50" in m.words
    # replaced: neither
    m = diverged(held, held[:70] + [5000 + i for i in range(30)], 70, 30, text)
    assert m.cause == "edited" and "edited at token 70" in m.words


def test_a_turn_that_continues_its_conversation_misses_nothing():
    e, served = make()
    first = toks(e, SYSTEM + "user: fix the parser " * 4)
    r1, rec1 = served_turn(e, served, first)
    assert rec1.miss_cause == "new" and rec1.miss_at == 0
    agent = next(a for a in e.agents if a.id == r1.agent)
    r2, rec2 = served_turn(e, served, agent.history + toks(e, " tool: 3 tests failed " * 3))
    assert r2.agent == r1.agent and rec2.miss_cause == "" and rec2.miss_at is None


def test_a_changed_system_prompt_on_its_own_agent_says_so_with_the_text_at_the_divergence():
    e, served = make(agents=1)
    body = toks(e, "user: fix the parser " * 6)
    old_sys = toks(e, SYSTEM + "date: Monday. ")
    r1, _ = served_turn(e, served, old_sys + body)
    new_sys = toks(e, SYSTEM + "date: Tuesday. ")
    req = ask(e, served, new_sys + body)[0]
    req.system_tokens = len(new_sys)
    run(e, lambda: req.finish_reason is not None)
    rec = served.drain_records()[-1]
    at = next(i for i, (x, y) in enumerate(zip(old_sys, new_sys, strict=False)) if x != y)
    assert rec.miss_cause == "system" and rec.miss_at == at
    assert "Mon" in rec.miss_old and "Tue" in rec.miss_new
    assert rec.prefilled_tokens == len(new_sys + body) - at


def test_a_trimmed_conversation_says_how_much_went():
    e, served = make(agents=1)
    sys = toks(e, SYSTEM)
    turns = [toks(e, f" user: step {i} of the refactor, file {i}.py ") for i in range(8)]
    full = sys + sum(turns, [])
    served_turn(e, served, full)
    trimmed = sys + sum(turns[3:], [])
    req = ask(e, served, trimmed)[0]
    req.system_tokens = len(sys)
    run(e, lambda: req.finish_reason is not None)
    rec = served.drain_records()[-1]
    at = common_prefix(full, trimmed)  # the system prompt and the words every turn begins with
    assert rec.miss_cause == "trimmed" and rec.miss_at == at >= len(sys)
    assert f"{len(sum(turns[:3], [])):,} tokens were removed" in rec.miss_words


def test_a_new_conversation_sharing_a_system_prompt_says_what_it_copied():
    e, served = make()
    sys = toks(e, SYSTEM * 3)
    r1, _ = served_turn(e, served, sys + toks(e, "user: task one"))
    req = ask(e, served, sys + toks(e, "user: a different task entirely, number two"))[0]
    req.system_tokens = len(sys)
    run(e, lambda: req.finish_reason is not None)
    rec = served.drain_records()[-1]
    assert rec.miss_cause == "new" and rec.copied_from == r1.agent and rec.copied_tokens >= len(sys)
    assert f"copied from agent {r1.agent}" in rec.miss_words


def test_an_edit_past_the_system_prompt_on_a_free_agent_is_an_edit_of_the_other_conversation():
    e, served = make()
    sys = toks(e, SYSTEM)
    base = sys + toks(e, "user: read the file main.py and tell me what it does " * 4)
    r1, _ = served_turn(e, served, base)
    edited = base[: len(base) * 3 // 4] + toks(e, " user: never mind, read util.py instead")
    req = ask(e, served, edited)[0]
    req.system_tokens = len(sys)
    run(e, lambda: req.finish_reason is not None)
    rec = served.drain_records()[-1]
    assert rec.agent != r1.agent and rec.miss_cause == "edited" and rec.miss_at == len(base) * 3 // 4
    assert "whose conversation stays whole" in rec.miss_words


def test_a_displaced_conversation_coming_back_is_told_who_displaced_it():
    e, served = make(agents=1)
    first = toks(e, "alpha works on the lexer " * 20)
    r1, _ = served_turn(e, served, first, key=None)
    served_turn(e, served, toks(e, "bravo works on the parser " * 20))  # takes the only agent
    back = first + toks(e, " user: go on with the lexer")
    _, rec = served_turn(e, served, back)
    assert rec.miss_cause == "displaced" and "displaced by conversation 2" in rec.miss_words


def test_a_history_dropped_while_it_waited_says_so():
    e, served = make(agents=1)
    first = toks(e, "alpha works on the lexer " * 20)
    r1, _ = served_turn(e, served, first)
    a = e.agents[0]
    e.backend.cells.drop(a.seq)  # what residency `drop` does to an idle agent
    a.evict()
    assert a.residency is Residency.NONE
    _, rec = served_turn(e, served, first + toks(e, " user: go on"))
    assert rec.miss_cause == "dropped" and rec.cached_tokens == 0


# what a request cost
def test_a_steps_energy_is_split_by_what_each_agent_read_and_adds_up():
    views = [AgentView(id=i, context=c, state="decoding", limit=4096, generated=0, turns=0, tail="")
             for i, c in ((0, 100), (1, 900), (2, 100))]
    rec = StepRecord(step=1, t=0.0, kind="decode", batch=3, batch_ids=[0, 1, 2], batch_cap=3, kv_type="f16",
                     agents=views, weight_bytes=3_000, kv_bytes=1_100.0, seconds=0.1, tokens=3, source="simulated",
                     joules=4.1, power_source="modeled")
    shares = joules_by_agent(rec)
    assert abs(sum(shares.values()) - 4.1) < 1e-9
    # the weights evenly (1,000 bytes each), the KV by context: 100, 900 and 100 of its 1,100 bytes
    assert abs(shares[1] / shares[0] - 1_900 / 1_100) < 1e-9 and abs(shares[0] - shares[2]) < 1e-12
    assert joules_by_agent(StepRecord(**{**rec.__dict__, "joules": None})) == {}


def metered(agents: int) -> tuple[Engine, ServedAgents, list[StepRecord]]:
    """Served agents on the sim with its modeled power, and every step record the engine makes."""
    backend = SimBackend(profile(SIM))
    served = ServedAgents(backend)
    e = Engine(backend, EngineSettings(agents=agents, batch_cap=agents, ctx_per_agent=4096, reference=False),
               agents=served, meter=make_meter("modeled", backend.profile))
    steps: list[StepRecord] = []
    step = e.step

    def kept() -> StepRecord:
        r = step()
        steps.append(r)
        return r

    e.step = kept  # type: ignore[method-assign]
    return e, served, steps


def test_each_request_is_charged_its_steps_and_the_charges_add_up_to_the_steps_energy():
    e, served, steps = metered(3)
    clients = [ask(e, served, toks(e, f"agent {i} reads file {i}.py " * (10 + 20 * i)), max_tokens=12 + 8 * i, seed=i)
               for i in range(3)]
    run(e, lambda: all(c.done is not None for _, c in clients))
    recs = served.drain_records()
    assert len(recs) == 3 and all(r.power_source == "modeled" and r.joules > 0 for r in recs)
    spent = sum(s.joules for s in steps if s.kind in ("prefill", "decode"))
    assert abs(sum(r.joules for r in recs) - spent) < 1e-6 * spent
    for r in recs:
        assert r.prefill_s > 0 and r.decode_s > 0
    longest = max(recs, key=lambda r: r.prompt_tokens + r.completion_tokens)
    assert longest.joules == max(r.joules for r in recs)


def test_a_cancelled_request_is_not_charged_for_the_next_request_on_its_agent():
    e, served, steps = metered(1)
    r1, c1 = ask(e, served, toks(e, "a long task " * 30), max_tokens=500)
    run(e, lambda: r1.completion_tokens >= 5)
    r2, c2 = ask(e, served, toks(e, "another task entirely " * 20), max_tokens=8)
    served.cancel(r1)  # closed before the next step, in which r2 takes the agent
    run(e, lambda: c2.done is not None)
    recs = served.drain_records()
    assert [r.id for r in recs] == [r1.id, r2.id] and r2.agent == r1.agent
    spent = sum(s.joules for s in steps if s.kind in ("prefill", "decode"))
    assert abs(sum(r.joules for r in recs) - spent) < 1e-6 * spent


def test_the_dashboard_lists_misses_and_each_agents_joules_per_token():
    from swarmtune.tui.stats import Stats

    e, served, steps = metered(2)
    clients = [ask(e, served, toks(e, f"agent {i} reads file {i}.py " * 20), max_tokens=10, seed=i) for i in range(2)]
    run(e, lambda: all(c.done is not None for _, c in clients))
    recs = served.drain_records()
    st = Stats()
    for s in steps:
        st.add(s)
    # each served turn's miss, once, with its agent (both were new conversations)
    assert sorted(aid for _, aid, _, _ in st.misses) == sorted(r.agent for r in recs)
    assert all(m.startswith("new at 0: ") and m.endswith(" prefilled") for *_, m in st.misses)
    for r in recs:
        # the steps' shares over its tokens: what its request was charged, over the tokens its agent generated
        generated = steps[-1].agents[r.agent].generated
        assert abs(st.agent_joules_per_token(r.agent, generated) / (r.joules / generated) - 1) < 1e-6

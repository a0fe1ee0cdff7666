"""The scheduler's choices where the KV budget is short: whom it frees, and when a history the budget took
comes back. Pure bookkeeping: agents and a budget, no backend."""

from swarmtune.engine.agents.agent import Agent, AgentState
from swarmtune.engine.scheduler import Scheduler
from swarmtune.engine.settings import EngineSettings

CHUNK = 256


def agent(i: int, state: AgentState, context: int = 0, pending: int = 0, evicted_at: int = -1) -> Agent:
    a = Agent(id=i, seq=i, limit=8192)
    a.history, a.pending, a.state, a.evicted_at = list(range(context)), list(range(pending)), state, evicted_at
    return a


def scheduler(budget_tokens: int) -> Scheduler:
    return Scheduler(EngineSettings(agents=4, chunk_tokens=CHUNK), lambda: budget_tokens)


def test_a_history_the_budget_took_waits_until_it_fits_back_with_room_to_spare():
    # 2,200 tokens held; the returning history (1,000) fits beside them, but not with a chunk to spare for it
    # and each agent holding cells: brought back now, the agent at its tool would be sent out to make room
    decoding = agent(0, AgentState.DECODE, context=1200)
    at_tool = agent(1, AgentState.TOOL, context=1000)
    back = agent(2, AgentState.PREFILL, pending=1000, evicted_at=5)
    plan = scheduler(3000).schedule([decoding, at_tool, back], step=10)
    assert plan.kind == "decode" and plan.agents == [decoding] and not plan.preempt
    # with room to spare it comes back, and nobody is sent out for it
    plan = scheduler(4000).schedule([decoding, at_tool, back], step=10)
    assert plan.kind == "prefill" and plan.agents == [back] and not plan.preempt


def test_an_idle_conversations_cells_are_room_for_a_history_coming_back():
    # a served conversation between its client's requests does not hold a returning one back
    decoding = agent(0, AgentState.DECODE, context=1200)
    idle = agent(1, AgentState.CLIENT, context=1000)
    back = agent(2, AgentState.PREFILL, pending=1000, evicted_at=5)
    plan = scheduler(3000).schedule([decoding, idle, back], step=10)
    assert plan.kind == "prefill" and plan.agents == [back]


def test_the_history_taken_most_recently_is_freed_first():
    # two agents decode and the budget is full: the one that was out before goes out again, though the other
    # holds the longer history
    never = agent(0, AgentState.DECODE, context=1400)
    was_out = agent(1, AgentState.DECODE, context=900, evicted_at=5)
    plan = scheduler(2300).schedule([never, was_out], step=10)
    assert plan.kind == "decode" and plan.preempt == [was_out] and plan.agents == [never]


def test_a_preempted_agent_is_readmitted_only_with_room_to_spare():
    held = agent(0, AgentState.DECODE, context=1200)
    out = agent(1, AgentState.PREEMPTED, pending=1000, evicted_at=5)
    s = scheduler(2500)  # 1,200 + 1,000 + 256 fits; with a chunk for the agent holding cells too, it does not
    s.schedule([held, out], step=10)
    assert out.state is AgentState.PREEMPTED
    scheduler(2800).schedule([held, out], step=10)
    assert out.state is AgentState.PREFILL


def test_a_returning_history_runs_where_nothing_else_could():
    # no agent decodes and it cannot come back with room to spare: it is prefilled anyway, rather than the
    # swarm standing still
    at_tool = agent(0, AgentState.TOOL, context=300)
    back = agent(1, AgentState.PREFILL, pending=1000, evicted_at=5)
    plan = scheduler(1400).schedule([at_tool, back], step=10)
    assert plan.kind == "prefill" and plan.agents == [back] and plan.chunk == CHUNK

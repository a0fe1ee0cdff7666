"""The agent traces (tests/agent_traces.py) against `swarmtune serve --clients` on the default model: per
turn, the cells each prompt reused (as its conversation's prefix, shifted past an edit, copied from another
agent) and what it prefilled, read from the response's own `swarmtune` object and `GET /v1/requests/{id}`."""

import httpx
import pytest

from tests.agent_traces import TRACES, TurnResult, replay
from tests.remote_helpers import served

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def server():
    with served("--clients", "--agents", "4", "--ctx", "3072", "--threads", "2", "--check") as s:
        yield s


def run(server, name: str) -> list[TurnResult]:
    turns = replay(server.url, TRACES[name](1))
    for t in turns:
        print(f"{name} {t.conversation}: prompt {t.prompt_tokens}, prefilled {t.prefilled_tokens}, "
              f"{ {k: v for k, v in (t.account or {}).items() if k != 'miss'} }")
    return turns


def account(t: TurnResult) -> dict:
    assert t.account is not None
    return t.account


def test_claude_code_prefills_its_header_value_and_the_new_turn_only(server):
    turns = run(server, "claude-code")
    assert account(turns[0])["miss"]["cause"] == "new"
    for prev, t in zip(turns, turns[1:], strict=False):
        a = account(t)
        new = t.prompt_tokens - prev.prompt_tokens  # the scripted reply and the tool's output
        assert a["miss"]["cause"] == "system" and a["shifted_tokens"] > prev.prompt_tokens * 0.8
        assert t.prefilled_tokens <= new + 40, "more than the changed header value and the new turn"
        rec = httpx.get(f"{server.url}/v1/requests/{t.id}", timeout=10).json()
        assert rec["shifted_tokens"] == a["shifted_tokens"] and rec["prefilled_tokens"] == t.prefilled_tokens
        assert "kept, shifted into place" in rec["miss_words"]


def test_opencode_keeps_the_history_its_moved_reminder_left(server):
    turns = run(server, "opencode")
    for prev, t in zip(turns, turns[1:], strict=False):
        a = account(t)
        # the reminder left the middle: the prefix before it is kept (on a copy: the old version stays whole);
        # at the end it follows a whole new exchange its old cells never saw, so it is prefilled again there
        assert a["cached_tokens"] > prev.prompt_tokens * 0.8 and a["shifted_tokens"] == 0
        assert t.prefilled_tokens <= t.prompt_tokens - prev.prompt_tokens + 120


def test_aider_keeps_what_follows_its_edited_file(server):
    turns = run(server, "aider")
    for prev, t in zip(turns, turns[1:], strict=False):
        a = account(t)
        assert a["miss"]["cause"] == "edited" and a["shifted_tokens"] > 0
        assert t.prefilled_tokens <= t.prompt_tokens - prev.prompt_tokens + 120


def test_subagents_copy_the_parents_prompt_and_the_parent_keeps_its_cells(server):
    turns = run(server, "subagents")
    parent = [t for t in turns if t.conversation == "parent"]
    firsts = [next(t for t in turns if t.conversation == c) for c in ("sub-agent-1", "sub-agent-2")]
    for t in firsts:
        assert account(t)["copied_tokens"] > t.prompt_tokens * 0.9
    for prev, t in zip(parent, parent[1:], strict=False):
        # every later parent turn reuses all its last prompt: the sub-agents cost none of its cells
        assert account(t)["cached_tokens"] >= prev.prompt_tokens


def test_a_trimmed_conversation_keeps_what_it_kept(server):
    turns = run(server, "trimmed")
    for t in turns[4:]:  # from the first trim on
        a = account(t)
        assert a["miss"]["cause"] == "trimmed" and a["shifted_tokens"] > 0
        assert t.prefilled_tokens < t.prompt_tokens * 0.4


def test_an_unknown_request_id_is_a_404_with_one_line(server):
    r = httpx.get(f"{server.url}/v1/requests/chatcmpl-nosuchthing", timeout=10)
    assert r.status_code == 404 and "no ended request" in r.json()["error"]["message"]

"""A prompt past an agent's context, answered in the words each API's own server uses, which the agents parse to
compact or to ask for less (docs/serving.md, "A full context"): OpenAI's `context_length_exceeded` with its
classic message (litellm maps it to ContextWindowExceededError, which aider catches; opencode's overflow patterns
match it), and Anthropic's "prompt is too long: N tokens > M maximum" (Claude Code compacts on it). Nothing is
truncated: the request is refused whole and the engine runs on."""

import re

import anthropic
import litellm
import openai
import pytest

from tests.remote_helpers import served

pytestmark = pytest.mark.model

CTX = 512
LONG = [{"role": "user", "content": "word " * 1200}]
# opencode's overflow patterns (packages/opencode/src/provider/error.ts), the ones our answers must meet
OPENCODE = [re.compile(p, re.I) for p in (r"prompt is too long", r"maximum context length is \d+ tokens",
                                          r"reduce the length of the messages", r"context[_ ]length[_ ]exceeded")]


@pytest.fixture(scope="module")
def server():
    with served("--clients", "--agents", "2", "--ctx", str(CTX), "--threads", "2") as s:
        yield s


def test_openai_context_length_exceeded(server):
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as err:
        c.chat.completions.create(model="m", messages=LONG, max_tokens=8)
    e = err.value
    assert e.code == "context_length_exceeded" and e.param == "messages"
    m = re.search(r"maximum context length is (\d+) tokens\. However, your messages resulted in (\d+) tokens",
                  e.message)
    assert m and int(m[1]) == CTX - 2 and int(m[2]) > CTX
    assert any(p.search(e.message) for p in OPENCODE)
    # a prompt that fits with a limit that does not: the completion's share said apart
    with pytest.raises(openai.BadRequestError) as err:
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=CTX)
    assert err.value.code == "context_length_exceeded" and err.value.param == "max_tokens"
    assert re.search(rf"However, you requested \d+ tokens \(\d+ in the messages, {CTX} in the completion",
                     err.value.message)
    # and the server goes on
    ok = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_litellm_raises_its_context_window_error(server):
    """aider's path: litellm.completion -> ContextWindowExceededError."""
    with pytest.raises(litellm.ContextWindowExceededError):
        litellm.completion(model="openai/m", api_base=server.url + "/v1", api_key="x", messages=LONG, max_tokens=8,
                           num_retries=0)


def test_anthropic_prompt_is_too_long(server):
    c = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as err:
        c.messages.create(model="m", messages=LONG, max_tokens=8)
    body = err.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    m = re.fullmatch(r"prompt is too long: (\d+) tokens > (\d+) maximum", body["error"]["message"])
    assert m and int(m[1]) > CTX and int(m[2]) == CTX - 2
    with pytest.raises(anthropic.BadRequestError) as err:
        c.messages.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=CTX)
    m = re.match(r"input length and `max_tokens` exceed context limit: (\d+) \+ (\d+) > (\d+)",
                 err.value.body["error"]["message"])
    assert m and int(m[2]) == CTX and int(m[3]) == CTX - 2


@pytest.fixture(scope="module")
def trimming():
    with served("--clients", "--agents", "2", "--ctx", str(CTX), "--threads", "2", "--on-overflow", "trim-front") as s:
        yield s


def _history(turns: int) -> list[dict]:
    """A long conversation: a system prompt, then turns of a user's question and a long answer."""
    msgs = [{"role": "system", "content": "You are a terse assistant. Always answer in one word."}]
    for i in range(turns):
        msgs += [{"role": "user", "content": f"Question {i}: " + "tell me more " * 20},
                 {"role": "assistant", "content": f"Answer {i}: " + "and so on " * 20}]
    return msgs + [{"role": "user", "content": "Last question: what is 2 + 2?"}]


def test_trim_front_drops_the_oldest_turns_and_says_so_in_each_api(trimming):
    """--on-overflow trim-front: the oldest turns go, system prompt and the last message kept, until the prompt
    and its limit fit; the response's `swarmtune.trimmed` says how many messages and tokens. A prompt whose last
    message alone is past the context is still refused with the API's own error."""
    c = openai.OpenAI(base_url=trimming.url + "/v1", api_key="x", max_retries=0)
    short = c.chat.completions.create(model="m", messages=_history(1), max_tokens=4)
    assert "trimmed" not in short.model_extra["swarmtune"]  # nothing past the context: nothing dropped
    r = c.chat.completions.create(model="m", messages=_history(12), max_tokens=16)
    trimmed = r.model_extra["swarmtune"]["trimmed"]
    assert trimmed["messages"] >= 2 and trimmed["messages"] % 2 == 0 and trimmed["tokens"] > 0
    assert r.usage.prompt_tokens + 16 <= CTX - 2 < r.usage.prompt_tokens + trimmed["tokens"] + 16
    # streamed: the last chunk carries the account
    chunks = list(c.chat.completions.create(model="m", messages=_history(12), max_tokens=8, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[-1].model_extra["swarmtune"]["trimmed"] == {"messages": trimmed["messages"],
                                                              "tokens": trimmed["tokens"]}
    a = anthropic.Anthropic(base_url=trimming.url, api_key="x", max_retries=0)
    hist = _history(12)
    m = a.messages.create(model="m", system=hist[0]["content"], messages=hist[1:], max_tokens=16)
    assert m.model_extra["swarmtune"]["trimmed"]["messages"] >= 2
    with pytest.raises(openai.BadRequestError) as err:  # the last message alone does not fit: refused whole
        c.chat.completions.create(model="m", messages=LONG, max_tokens=8)
    assert err.value.code == "context_length_exceeded"

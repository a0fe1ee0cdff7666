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

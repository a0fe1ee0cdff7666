"""Thinking on and off per request, reasoning in each API's own shape, and a tool call's round trip, through
the real SDKs (openai, anthropic, litellm; chat, Messages and Responses) against `swarmtune serve --clients`
on a tiny random-weight GGUF that carries Qwen3.5's own template (as the pinned llama.cpp vendors it).

Qwen3.5's template opens the thinking block in the prompt (`<think>\\n`) unless `enable_thinking` is false,
when it closes it (`<think>\\n\\n</think>\\n\\n`): the template's own rule. A reply that starts inside the block
is reasoning until `</think>`; random weights never close it, so a thinking reply here is all reasoning."""

import json

import anthropic
import httpx
import litellm
import openai
import pytest
from llama_templates import template

from tests.remote_helpers import served
from tests.tiny_gguf import llama_dense

pytestmark = pytest.mark.xdist_group("qwen35_served")

READ = {"type": "function", "function": {"name": "read_file", "description": "Read a file", "parameters": {
    "type": "object", "properties": {"path": {"enum": ["a.py", "b.py"]}}, "required": ["path"]}}}
ASK = [{"role": "user", "content": "Open a.py."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = llama_dense(tmp_path_factory.mktemp("qwen35") / "qwen35.gguf", template("Qwen3.5-4B.jinja"))
    with served("--clients", "--model", str(path), "--agents", "2", "--ctx", "2048", "--threads", "1") as s:
        yield s


def prompt_of(server, **body) -> str:
    r = httpx.post(server.url + "/apply-template", json={"messages": ASK, **body}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["prompt"]


def test_enable_thinking_false_closes_the_block_in_the_prompt(server):
    assert prompt_of(server).endswith("<|im_start|>assistant\n<think>\n")
    off = prompt_of(server, chat_template_kwargs={"enable_thinking": False})
    assert off.endswith("<think>\n\n</think>\n\n")
    assert prompt_of(server, reasoning_effort="none") == off  # effort none is thinking off
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": ASK, "chat_template_kwargs": {
        "enable_thinking": "no"}}, timeout=30)
    assert r.status_code == 400 and "enable_thinking must be a boolean" in r.json()["error"]["message"]
    assert prompt_of(server, chat_template_kwargs={"no_such_switch": 1}) == prompt_of(server)  # unused: ignored


def test_openai_chat_reasoning_whole_and_streamed(server):
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    kw = {"model": "m", "messages": ASK, "max_tokens": 8, "temperature": 0.0}
    whole = c.chat.completions.create(**kw).choices[0].message
    reasoning = whole.model_extra["reasoning_content"]
    assert reasoning and not whole.content and "<think>" not in reasoning
    parts = [ch.choices[0].delta.model_extra.get("reasoning_content") or "" for ch in
             c.chat.completions.create(**kw, stream=True) if ch.choices]
    assert "".join(parts) == reasoning  # greedy: the same reply, streamed as it was read whole
    raw = c.chat.completions.with_raw_response.create(**kw).parse()
    record = httpx.get(f"{server.url}/v1/requests/{raw.id.removeprefix('chatcmpl-')}", timeout=30).json()
    assert record["family"] == "qwen3-xml" and record["reasoning_chars"] == len(reasoning)


def test_openai_tool_call_round_trip_with_thinking_off(server):
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    kw = {"model": "m", "tools": [READ], "tool_choice": "required", "max_tokens": 200, "temperature": 0.0,
          "extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}
    msg = c.chat.completions.create(messages=ASK, **kw).choices[0].message
    assert msg.tool_calls and msg.tool_calls[0].function.name == "read_file"
    assert json.loads(msg.tool_calls[0].function.arguments)["path"] in ("a.py", "b.py")
    streamed = [d for ch in c.chat.completions.create(messages=ASK, stream=True, **kw) if ch.choices
                for d in ch.choices[0].delta.tool_calls or []]
    assert [d.function.arguments for d in streamed] == [msg.tool_calls[0].function.arguments]
    back = [*ASK, {"role": "assistant", "content": None, "reasoning_content": "I should read it.",
                   "tool_calls": [tc.model_dump() for tc in msg.tool_calls]},
            {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "print('hi')"}]
    shown = httpx.post(server.url + "/apply-template", json={"messages": back, "tools": [READ]}, timeout=30)
    text = shown.json()["prompt"]  # Qwen3.5's own rule keeps the last turn's reasoning, and the call in XML
    assert "<think>\nI should read it.\n</think>" in text and "<function=read_file>" in text and "print('hi')" in text
    again = c.chat.completions.create(messages=back, **{**kw, "tool_choice": "auto", "max_tokens": 4})
    assert again.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_anthropic_thinking_blocks_with_a_signature(server):
    c = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    kw = {"model": "m", "max_tokens": 8, "messages": ASK, "extra_body": {"temperature": 0.0}}
    m = c.messages.create(**kw, thinking={"type": "enabled", "budget_tokens": 1024})
    assert m.content[0].type == "thinking" and m.content[0].thinking and m.content[0].signature
    with c.messages.stream(**kw, thinking={"type": "enabled", "budget_tokens": 1024}) as s:
        final = s.get_final_message()
    assert final.content[0].type == "thinking" and final.content[0].thinking == m.content[0].thinking
    assert final.content[0].signature == m.content[0].signature
    off = c.messages.create(**kw, thinking={"type": "disabled"})
    assert all(b.type != "thinking" for b in off.content)
    back = c.messages.create(model="m", max_tokens=2, messages=[*ASK, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "hm", "signature": m.content[0].signature},
        {"type": "text", "text": "ok"}]}, {"role": "user", "content": "go on"}])
    assert back.stop_reason in ("end_turn", "max_tokens")


def test_anthropic_and_responses_tool_calls_round_trip(server):
    """A call held to the family's grammar (any / required) comes back as a tool_use block and as a
    function_call item, and its result goes back in each API's own shape."""
    a = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    tool = {"name": "read_file", "description": "Read a file", "input_schema": READ["function"]["parameters"]}
    m = a.messages.create(model="m", max_tokens=200, messages=ASK, tools=[tool], tool_choice={"type": "any"},
                          thinking={"type": "disabled"}, extra_body={"temperature": 0.0})
    use = next(b for b in m.content if b.type == "tool_use")
    assert m.stop_reason == "tool_use" and use.name == "read_file" and use.input["path"] in ("a.py", "b.py")
    back = a.messages.create(model="m", max_tokens=2, tools=[tool], messages=[*ASK, {"role": "assistant", "content": [
        {"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}]}, {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": use.id, "content": "print('hi')"}]}])
    assert back.stop_reason in ("end_turn", "max_tokens", "tool_use")
    o = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    fn = {"type": "function", **READ["function"]}
    r = o.responses.create(model="m", input="Open a.py.", tools=[fn], tool_choice="required", max_output_tokens=200,
                           temperature=0.0, reasoning={"effort": "none"})
    call = next(i for i in r.output if i.type == "function_call")
    assert call.name == "read_file" and json.loads(call.arguments)["path"] in ("a.py", "b.py")
    events = list(o.responses.create(model="m", input="Open a.py.", tools=[fn], tool_choice="required",
                                     max_output_tokens=200, temperature=0.0, reasoning={"effort": "none"},
                                     stream=True))
    done = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
    assert done == [call.arguments]
    again = o.responses.create(model="m", previous_response_id=r.id, max_output_tokens=2, tools=[fn], input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": "print('hi')"}])
    assert again.status in ("completed", "incomplete")


def test_responses_reasoning_items_whole_streamed_and_sent_back(server):
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    r = c.responses.create(model="m", input="Open a.py.", max_output_tokens=8, temperature=0.0)
    item = r.output[0]
    assert item.type == "reasoning" and item.content and item.content[0].text
    events = list(c.responses.create(model="m", input="Open a.py.", max_output_tokens=8, temperature=0.0,
                                     stream=True))
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert deltas == item.content[0].text and events[-1].type == "response.completed"
    with c.responses.stream(model="m", input="Open a.py.", max_output_tokens=8, temperature=0.0) as s:
        final = s.get_final_response()  # the SDK's own accumulator: each item's events agree with its id
    assert final.output[0].type == "reasoning" and final.output[0].content[0].text == item.content[0].text
    again = c.responses.create(model="m", max_output_tokens=2, input=[
        {"role": "user", "content": "Open a.py."}, item.model_dump(exclude_none=True),
        {"role": "assistant", "content": "ok"}, {"role": "user", "content": "go on"}])
    assert again.status in ("completed", "incomplete")


def test_litellm_sees_reasoning_content(server):
    r = litellm.completion(model="openai/m", api_base=server.url + "/v1", api_key="x", messages=ASK,
                           max_tokens=8, temperature=0.0)
    assert r.choices[0].message.reasoning_content


def test_a_call_that_did_not_parse_is_recorded_with_its_text():
    """A call the model began and broke: its record says why and keeps the text; the agents panel's miss too."""
    from swarmtune.engine.agents.served_request import ServedRequest, request_record
    from swarmtune.engine.conversation.formats.hermes import Hermes
    from swarmtune.engine.conversation.formats.reader import ReplyReader
    from swarmtune.engine.conversation.formats.reply import ReplyContext
    from swarmtune.engine.conversation.sampling import SamplingParams

    reader = ReplyReader(Hermes(), ReplyContext(tools=(READ,)), "qwen3-hermes")
    req = ServedRequest(prompt=[1, 2], max_tokens=8, params=SamplingParams(), reader=reader)
    req.text.feed(b'Sure.\n<tool_call>\n{"name": "read_file", "arguments": {"path": ')
    rec = request_record(req, 1.0, req.arrival + 1)
    assert rec.family == "qwen3-hermes" and "ended inside a call" in rec.call_miss
    assert rec.call_miss_text.endswith('{"path": ')


def test_a_template_file_replaces_the_ggufs_and_a_bad_one_fails_in_one_line(tmp_path):
    """--chat-template-file: a GGUF whose template is no family's (Llama 2's [INST]) served with Qwen3.5's from a
    file renders and reads as Qwen3.5; a file that is missing, or does not parse, is one line and exit 2."""
    from tests.conftest import run_cli

    path = llama_dense(tmp_path / "plain.gguf", "{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}")
    (tmp_path / "qwen35.jinja").write_text(template("Qwen3.5-4B.jinja"))
    with served("--clients", "--model", str(path), "--agents", "1", "--ctx", "1024", "--threads", "1",
                "--chat-template-file", str(tmp_path / "qwen35.jinja")) as s:
        meta = httpx.get(s.url + "/v1/models", timeout=30).json()["data"][0]["meta"]
        assert meta["tool_call_format"] == "qwen3-xml" and "--chat-template-file" in meta["chat_template"]
        assert prompt_of(s).endswith("<|im_start|>assistant\n<think>\n")
    (tmp_path / "broken.jinja").write_text("{% for m in messages %}")
    for name, needle in (("none.jinja", "No such file"), ("broken.jinja", "does not parse")):
        out = run_cli("serve", "--clients", "--model", str(path), "--port", "0", "--chat-template-file",
                      str(tmp_path / name), timeout=120)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and needle in lines[0], out.stderr


def test_reasoning_format_none_leaves_the_reasoning_in_the_content(tmp_path):
    """--reasoning-format none, as llama-server's: the reply as the model wrote it, nothing split off."""
    path = llama_dense(tmp_path / "qwen35.gguf", template("Qwen3.5-4B.jinja"))
    with served("--clients", "--model", str(path), "--agents", "1", "--ctx", "1024", "--threads", "1",
                "--reasoning-format", "none") as s:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
        m = c.chat.completions.create(model="m", messages=ASK, max_tokens=8, temperature=0.0).choices[0].message
    assert m.content and not (m.model_extra or {}).get("reasoning_content")

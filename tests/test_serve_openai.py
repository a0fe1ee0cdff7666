"""`swarmtune serve --clients` on the default model, driven by clients nobody here wrote: the `openai`
SDK (sync and async, streamed and not), litellm, and raw HTTP for what an SDK hides (the SSE lines)."""

import asyncio
import json
import os
import threading
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from swarmtune.engine.conversation.sampling import SamplingParams
from swarmtune.engine.kv.types import F16
from swarmtune.engine.record.records import iter_lines
from tests.conftest import until
from tests.remote_helpers import served

pytestmark = pytest.mark.model

HAIKU = [{"role": "user", "content": "Write a short poem about a cache that forgets."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    rec = tmp_path_factory.mktemp("serve") / "traffic.jsonl"
    with served("--clients", "--agents", "8", "--ctx", "2048", "--threads", "2", "--check",
                "--record", str(rec)) as s:
        s.record = rec
        yield s


def client(server, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="anything", **kw)


def requests_recorded(server) -> list[dict]:
    out = []
    for line, complete in iter_lines(server.record):
        if complete and '"type":"request"' in line:
            out.append(json.loads(line))
    return out


def state(server) -> dict:
    return httpx.get(server.url + "/v1/state").json()


def test_models_names_the_loaded_file(server):
    ids = [m.id for m in client(server).models.list().data]
    assert ids == ["SmolLM2-135M-Instruct.Q4_1.gguf"]


def test_a_stream_ends_in_done_with_usage_only_when_asked(server):
    body = {"model": "any", "messages": HAIKU, "max_tokens": 12, "stream": True}
    for include in (True, False):
        b = dict(body, stream_options={"include_usage": include}) if include else body
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=b, timeout=60) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            lines = [x for x in r.iter_lines() if x]
        assert lines[-1] == "data: [DONE]"
        chunks = [json.loads(x[len("data: "):]) for x in lines[:-1]]
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)
        usage = [c for c in chunks if c.get("usage")]
        if include:
            assert len(usage) == 1 and usage[0] is chunks[-1] and usage[0]["choices"] == []
            assert usage[0]["usage"]["completion_tokens"] == 12
        else:
            assert usage == [] and all("usage" not in c for c in chunks)
        assert any(c["choices"] and c["choices"][0]["finish_reason"] == "length" for c in chunks)


def test_the_sdk_streams_and_not(server):
    c = client(server)
    r = c.chat.completions.create(model="m", messages=HAIKU, max_tokens=16, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 16
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    parts, usage = [], None
    for ch in c.chat.completions.create(model="m", messages=HAIKU, max_tokens=16, temperature=0, stream=True,
                                        stream_options={"include_usage": True}):
        if ch.choices:
            parts.append(ch.choices[0].delta.content or "")
        else:
            usage = ch.usage
    assert "".join(parts) == r.choices[0].message.content  # greedy: the same text either way
    assert usage.completion_tokens == 16 and usage.prompt_tokens == r.usage.prompt_tokens


SYSTEM = ("You are a careful coding agent. You can read files, run tests and propose patches. Answer in short "
          "sentences and never invent file names.")


def test_a_shared_system_prompt_is_copied_and_the_copy_decodes_as_a_prefill_would(server, llama_backend):
    c = client(server)
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Which file holds the parser?"}]
    c.chat.completions.create(model="m", messages=first, max_tokens=8, temperature=0)
    second = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Summarise the last test run."}]
    r = c.chat.completions.create(model="m", messages=second, max_tokens=32, temperature=0)
    assert r.usage.prompt_tokens_details.cached_tokens >= 32  # the system prompt's cells, copied
    b = llama_backend
    want = greedy_reference(b, b.text.tokenize(b.text.chat(second, add_assistant=True)), 32)
    assert r.choices[0].message.content == want.rstrip("\ufffd")[: len(r.choices[0].message.content)]
    assert len(r.choices[0].message.content) >= 0.8 * len(want)


def test_completions_and_litellm(server):
    c = client(server)
    r = c.completions.create(model="m", prompt="def fibonacci(n):", max_tokens=10, temperature=0)
    assert r.object == "text_completion" and r.usage.completion_tokens == 10 and r.choices[0].text
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # its price list from the wheel, not the network
    import litellm

    out = litellm.completion(model="openai/smollm2", api_base=server.url + "/v1", api_key="x", messages=HAIKU,
                             max_tokens=8)
    assert out.choices[0].message.content and out.usage.completion_tokens == 8
    got = "".join(ch.choices[0].delta.content or "" for ch in litellm.completion(
        model="openai/smollm2", api_base=server.url + "/v1", api_key="x", messages=HAIKU, max_tokens=8, stream=True))
    assert got


def greedy_reference(b, prompt: list[int], n: int) -> str:
    """The engine's own unbatched greedy decode: one sequence, nothing else in its batch."""
    b.open(F16, 1, 2048)
    b.steps.set_sampler(0, SamplingParams(temperature=0.0))
    pos = 0
    for i in range(0, len(prompt), b.max_chunk_tokens):
        chunk = prompt[i : i + b.max_chunk_tokens]
        b.steps.prefill(0, chunk, pos)
        pos += len(chunk)
    tok, out = b.steps.first_token_after_prefill(0), []
    for _ in range(n):
        out.append(tok)
        (tok,), _ = b.steps.launch_decode([0], [tok], [pos])()
        pos += 1
    return b"".join(b.text.token_bytes(t) for t in out).decode("utf-8", errors="replace")


def test_greedy_text_under_load_equals_the_unbatched_decode_and_a_seed_repeats(server, llama_backend):
    msgs = [{"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "List three uses of a hash map."}]
    c = client(server)
    stop = threading.Event()
    errors: list[Exception] = []

    def noise(i: int) -> None:  # seven other clients streaming meanwhile
        k = client(server)
        try:
            while not stop.is_set():
                for _ in k.chat.completions.create(model="m", stream=True, max_tokens=24, messages=[
                        {"role": "user", "content": f"Client {i}: describe a river in {i + 3} words."}]):
                    pass
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=noise, args=(i,)) for i in range(7)]
    for t in threads:
        t.start()
    time.sleep(2)
    try:
        greedy = c.chat.completions.create(model="m", messages=msgs, max_tokens=40, temperature=0)
        seeded = [c.chat.completions.create(model="m", messages=msgs, max_tokens=24, temperature=0.9, seed=7)
                  for _ in range(2)]
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors
    assert seeded[0].choices[0].message.content == seeded[1].choices[0].message.content
    b = llama_backend
    prompt = b.text.tokenize(b.text.chat(msgs, add_assistant=True))
    want = greedy_reference(b, prompt, 40)
    got = greedy.choices[0].message.content
    assert got[:100] == want[:100] and len(got) > 32


def test_a_stop_sequence_never_shows(server):
    c = client(server)
    msgs = [{"role": "user", "content": "Count from one to twenty in words, separated by commas."}]
    full = c.chat.completions.create(model="m", messages=msgs, max_tokens=48, temperature=0).choices[0].message.content
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert stop.strip()
    cut = c.chat.completions.create(model="m", messages=msgs, max_tokens=48, temperature=0, stop=[stop, "@@@"])
    assert cut.choices[0].finish_reason == "stop" and cut.choices[0].message.content == full[: full.index(stop)]
    parts = [ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model="m", messages=msgs, max_tokens=48, temperature=0, stop=stop, stream=True) if ch.choices]
    assert "".join(parts) == full[: full.index(stop)]


def test_ignore_eos_generates_max_tokens_as_llama_server_does(server):
    c = client(server)
    msgs = [{"role": "user", "content": "Answer with the single word yes."}]
    short = c.chat.completions.create(model="m", messages=msgs, max_tokens=48, temperature=0)
    assert short.choices[0].finish_reason == "stop" and short.usage.completion_tokens < 48
    full = c.chat.completions.create(model="m", messages=msgs, max_tokens=48, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == 48
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": msgs, "ignore_eos": "yes"})
    assert r.status_code == 400 and "ignore_eos" in r.json()["error"]["message"]


def test_a_changed_system_header_is_named_as_the_cause_of_the_miss(server):
    # Claude Code's way: a value in the system prompt that changes every request (anthropics/claude-code#32636)
    c = client(server)
    task = [{"role": "user", "content": "List three uses of a KV cache, one line each."}]
    key = {"X-Swarmtune-Agent": "header-test"}

    def turn(day: str):
        sys = {"role": "system", "content": f"You are a coding agent. Today is {day}. Work carefully."}
        return c.chat.completions.create(model="m", messages=[sys, *task], max_tokens=4, temperature=0,
                                         extra_headers=key)

    first = turn("Monday").model_extra["swarmtune"]
    assert first["miss"]["cause"] == "new" and first["cached_tokens"] == 0
    again = turn("Tuesday").model_extra["swarmtune"]
    assert again["miss"]["cause"] == "system" and "Mon" in again["miss"]["old"] and "Tue" in again["miss"]["new"]
    assert again["cached_tokens"] == again["miss"]["at"] > 0
    assert until(lambda: len([r for r in requests_recorded(server) if r["key"] == "header-test"]) == 2)
    rec = [r for r in requests_recorded(server) if r["key"] == "header-test"][-1]
    assert rec["miss_cause"] == "system" and rec["miss_at"] == again["miss"]["at"]


async def test_eight_conversations_reuse_their_cells_turn_after_turn(server):
    c = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x")

    async def conversation(i: int) -> list[tuple[int, int, int]]:
        msgs = [{"role": "system", "content": f"You are coding agent {i}."},
                {"role": "user", "content": f"Fix bug #{i} in parser.py."}]
        seen = []
        for turn in range(3):
            r = await c.chat.completions.create(model="m", messages=msgs, max_tokens=20, temperature=0.7, seed=i)
            u = r.usage
            seen.append((u.prompt_tokens, u.prompt_tokens_details.cached_tokens, u.completion_tokens))
            msgs += [{"role": "assistant", "content": r.choices[0].message.content},
                     {"role": "tool", "content": f"$ pytest -k {i}\n{turn + 1} failed, line {10 * turn + i}"}]
        return seen

    results = await asyncio.gather(*(conversation(i) for i in range(8)))
    for seen in results:
        for (p0, _, g0), (p1, cached, _) in zip(seen, seen[1:], strict=False):
            assert p0 <= cached <= p0 + g0  # the whole last prompt, and what it generated, reused
            assert cached < p1
    recs = requests_recorded(server)
    assert recs and all(r["prefilled_tokens"] == r["prompt_tokens"] - r["cached_tokens"] for r in recs)


def test_a_kv_switch_during_eight_live_streams(server):
    errors, done = [], []

    def stream(i: int) -> None:
        try:
            n, finish = 0, None
            for ch in client(server).chat.completions.create(
                    model="m", stream=True, max_tokens=60, temperature=0.5, seed=i,
                    messages=[{"role": "user", "content": f"Tell story {i} about a compiler."}]):
                if ch.choices and ch.choices[0].delta.content:
                    n += 1
                if ch.choices and ch.choices[0].finish_reason:
                    finish = ch.choices[0].finish_reason
            done.append((n, finish))
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    assert until(lambda: (state(server)["step"] or {}).get("batch", 0) >= 4, timeout=60)
    kv = state(server)["settings"]["kv_type"]
    r = httpx.post(server.url + "/v1/control", json={"kv_type": "q8_0" if kv == "f16" else "f16"})
    assert r.status_code == 200
    for t in threads:
        t.join(120)
    assert not errors and len(done) == 8 and all(f in ("stop", "length") for _, f in done)
    assert state(server)["error"] is None  # --check held through the switch


def test_a_client_that_leaves_frees_its_agent(server):
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "Write a very long essay about caches."}], "max_tokens": 1500,
            "stream": True}) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i > 6:
                break
    assert until(lambda: any(x["finish_reason"] == "cancelled" for x in requests_recorded(server)), timeout=20)
    rec = next(x for x in requests_recorded(server) if x["finish_reason"] == "cancelled")
    assert rec["completion_tokens"] < 1500
    assert state(server)["error"] is None


BAD = [
    (b"{not json", "not JSON"),
    (b'{"messages": "hi"}', "messages"),
    (b'{"messages": [{"role": "robot", "content": "hi"}]}', "messages.0.role"),
    (b'{"messages": []}', "messages is empty"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}', "temperature"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5000}', "However, you requested"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "n": 2}', "n must be 1"),
    (b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', "not valid UTF-8"),
    (json.dumps({"messages": [{"role": "user", "content": "word " * 3000}]}).encode(),
     "This model's maximum context length is"),
]


@pytest.mark.parametrize(("body", "says"), BAD)
def test_a_bad_request_is_a_400_in_openai_shape_and_changes_nothing(server, body, says):
    before = len(requests_recorded(server))
    r = httpx.post(server.url + "/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and says in err["message"] and "\n" not in err["message"]
    with pytest.raises(openai.BadRequestError):
        client(server, max_retries=0).chat.completions.create(model="m", messages=[], max_tokens=1)
    time.sleep(0.3)
    assert len(requests_recorded(server)) == before


def test_an_unknown_route_is_a_404_in_openai_shape(server):
    r = httpx.post(server.url + "/v1/embeddings", json={"input": "x"})
    assert r.status_code == 404 and "no route" in r.json()["error"]["message"]


def test_a_token_is_the_api_key_and_a_full_queue_is_a_503():
    with served("--clients", "--agents", "1", "--max-queue", "1", "--threads", "2", "--token", "sekrit") as s:
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=s.url + "/v1", api_key="wrong", max_retries=0).models.list()
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="sekrit", max_retries=0)
        statuses: list[int] = []

        def one() -> None:
            try:
                c.chat.completions.create(model="m", messages=HAIKU, max_tokens=64, extra_body={"ignore_eos": True})
                statuses.append(200)
            except openai.APIStatusError as e:
                statuses.append(e.status_code)
                if e.status_code == 503:
                    assert e.response.headers["retry-after"] == "1"

        def running() -> float:
            text = httpx.get(s.url + "/metrics", timeout=5).text
            return next(m.samples[0].value for m in text_string_to_metric_families(text)
                        if m.name == "swarmtune_requests_running")

        # the agent busy first (it takes its request on the engine's thread, which a loaded host may hold up):
        # then the queue holds one more and each of the rest gets a 503
        first = threading.Thread(target=one)
        first.start()
        assert until(lambda: running() == 1, timeout=60), "the first request never ran"
        threads = [threading.Thread(target=one) for _ in range(5)]
        for t in threads:
            t.start()
        for t in [first, *threads]:
            t.join(120)
        assert sorted(statuses) == [200, 200, 503, 503, 503, 503], statuses


@pytest.mark.slow
def test_sixty_four_clients_lose_and_repeat_no_token_and_see_only_the_documented_503():
    import subprocess
    import sys

    from tests.conftest import ROOT

    out = subprocess.run([sys.executable, str(ROOT / "bench" / "serve_load.py"), "--seconds", "15"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.stdout.strip().splitlines()[-1] == "bad: 0", out.stdout + out.stderr[-2000:]
    assert "503" in out.stdout  # the queue did fill: the documented answer, not another 5xx


def test_metrics_hold_the_request_histograms_and_the_kv_usage(server):
    client(server).chat.completions.create(model="m", messages=HAIKU, max_tokens=4)
    text = httpx.get(server.url + "/metrics").text
    for name in ("swarmtune_time_to_first_token_seconds_bucket", "swarmtune_inter_token_latency_seconds_bucket",
                 "swarmtune_request_queue_time_seconds_bucket", "swarmtune_e2e_request_latency_seconds_bucket",
                 "swarmtune_requests_total", "swarmtune_prompt_tokens_cached_total", "swarmtune_requests_running",
                 "swarmtune_requests_waiting", "swarmtune_request_prefill_time_seconds_bucket",
                 "vllm:request_prefill_time_seconds_bucket"):
        assert name in text, name
    usage = [line for line in text.splitlines() if line.startswith("swarmtune_kv_cache_usage_ratio")]
    assert usage and 0.0 < float(usage[0].split()[-1]) <= 1.0
    # read as Prometheus reads it: the prefix cache under vLLM's names, misses by cause, a request's energy
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    total = {f: sum(s.value for s in fams[f].samples if s.name == f + "_total")
             for f in ("swarmtune_prefix_cache_queries", "swarmtune_prefix_cache_hits",
                       "swarmtune_prefix_cache_copied_tokens", "swarmtune_prefix_cache_shifted_tokens")}
    assert fams["swarmtune_prefix_cache_queries"].type == "counter"
    assert fams["swarmtune_prefix_cache_shifted_tokens"].type == "counter"
    assert total["swarmtune_prefix_cache_queries"] > 0
    assert total["swarmtune_prefix_cache_copied_tokens"] + total["swarmtune_prefix_cache_shifted_tokens"] \
        <= total["swarmtune_prefix_cache_hits"] <= total["swarmtune_prefix_cache_queries"]
    causes = {s.labels["cause"] for s in fams["swarmtune_cache_misses"].samples if s.name.endswith("_total")}
    assert "new" in causes
    assert fams["swarmtune_request_joules"].type == "histogram"

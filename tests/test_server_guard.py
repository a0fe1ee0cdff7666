"""The server's front door against hostile input, on a real `swarmtune serve --clients` on loopback: every
route answers any body with a 4xx in its API's own error shape (never a 5xx, never a dropped connection) and
holds no more of a body than its limit; a loopback server without a token answers only loopback names, and
no browser page of another origin."""

import json
import socket
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import SIM
from tests.remote_helpers import served

POST_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens",
               "/v1/responses", "/v1/control")
FIELDS = ("model", "messages", "prompt", "input", "system", "max_tokens", "max_completion_tokens",
          "max_output_tokens", "stream", "temperature", "top_p", "top_k", "n", "seed", "stop", "stop_sequences",
          "tools", "tool_choice", "response_format", "logprobs", "top_logprobs", "batch_cap", "kv_type", "agents",
          "residency", "autotune", "paused")
HOSTILE = (
    b"[" * 200_000,  # deeper than any parser's stack
    b'{"max_tokens": ' + b"9" * 5000 + b"}",  # past Python's digits limit for an int
    b'{"max_tokens": ' + b"9" * 4000 + b"}",  # within it: a number no field can take
    b'{"max_tokens": 1e400, "messages": [{"role": "user", "content": "hi"}]}',
    b'{"temperature": NaN}',
    b'{"messages": [{"role": "user", "content": "\\ud800"}], "max_tokens": 4}',  # a lone surrogate
    b'{"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]}',
    b"\xff\xfe{}",
    b"",
    b"null",
    b'"a string"',
    b'{"a": "' + b"\\" * 4001 + b'"}',
)
_json = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=16)
_bodies = st.one_of(
    st.dictionaries(st.sampled_from(FIELDS), _json, max_size=6).map(lambda d: json.dumps(d).encode()),
    st.sampled_from(HOSTILE),
    st.binary(max_size=48))


@pytest.fixture(scope="module")
def clients_server():
    # a short context: a body that happens to be a valid request is served quickly
    with served("--sim", SIM, "--clients", "--agents", "2", "--ctx", "512") as s:
        yield s


def _assert_shape(route: str, r: httpx.Response) -> None:
    body = r.json()
    if route.startswith("/v1/messages"):
        assert body["type"] == "error" and body["error"]["message"], body
        msg = body["error"]["message"]
    elif route == "/v1/control":
        msg = body["detail"] if isinstance(body["detail"], str) else body["detail"][0]["msg"]
    else:
        msg = body["error"]["message"]
    assert isinstance(msg, str) and msg and "\n" not in msg and "Traceback" not in msg, body


@given(route=st.sampled_from(POST_ROUTES), body=_bodies)
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_no_body_reaches_a_5xx(clients_server, route, body):
    r = httpx.post(clients_server.url + route, content=body, headers={"content-type": "application/json"},
                   timeout=60)
    assert r.status_code < 500, (route, body[:120], r.status_code, r.text[:300])
    if r.status_code >= 400:
        _assert_shape(route, r)


def test_each_hostile_body_on_each_route_and_the_server_lives(clients_server):
    url = clients_server.url
    before = httpx.get(url + "/v1/state").json()["settings"]
    for route in POST_ROUTES:
        for body in HOSTILE:
            r = httpx.post(url + route, content=body, headers={"content-type": "application/json"}, timeout=60)
            assert 400 <= r.status_code < 500, (route, body[:80], r.status_code, r.text[:300])
            _assert_shape(route, r)
    assert httpx.get(url + "/v1/models").status_code == 200
    assert httpx.get(url + "/v1/state").json()["settings"] == before  # nothing changed


def test_a_body_is_bounded_while_it_streams_in(clients_server):
    url = clients_server.url
    r = httpx.post(url + "/v1/control", content=b'{"paused": false' + b" " * 70_000 + b"}",
                   headers={"content-type": "application/json"})
    assert r.status_code == 413 and "65536" in r.json()["detail"]

    def endless():  # chunked: no length to refuse up front, so the count as it streams refuses it
        for _ in range(1000):
            yield b" " * 65536

    r = httpx.post(url + "/v1/chat/completions", content=endless(), headers={"content-type": "application/json"},
                   timeout=60)
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    r = httpx.post(url + "/v1/messages", content=endless(), headers={"content-type": "application/json"},
                   timeout=60)
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"
    assert httpx.get(url + "/v1/models").status_code == 200


def test_a_body_is_json(clients_server):
    url = clients_server.url
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    r = httpx.post(url + "/v1/chat/completions", content=body, headers={"content-type": "text/plain"})
    assert r.status_code == 415 and "application/json" in r.json()["error"]["message"]
    r = httpx.post(url + "/v1/control", content='{"paused": true}',
                   headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 415
    assert httpx.get(url + "/v1/state").json()["settings"]["paused"] is False


def _raw_get(url: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
    """A request with exactly these headers (httpx would set Host from the URL)."""
    host, port = url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        lines = [f"GET {path} HTTP/1.1", *(f"{k}: {v}" for k, v in headers.items()), "Connection: close", "", ""]
        sock.sendall("\r\n".join(lines).encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), rest


def test_local_means_local(clients_server):
    url = clients_server.url
    port = url.rsplit(":", 1)[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"[::1]:{port}"):
        assert _raw_get(url, "/v1/state", {"Host": host})[0] == 200, host
    status, body = _raw_get(url, "/v1/state", {"Host": f"attacker.example:{port}"})  # a rebound name
    assert status == 403 and "--allow-host attacker.example" in json.loads(body)["error"]["message"]
    status, body = _raw_get(url, "/v1/messages", {"Host": "attacker.example"})
    assert status == 403 and json.loads(body)["error"]["type"] == "permission_error"
    # a page of another origin, even sending a loopback Host
    r = httpx.post(url + "/v1/control", json={"paused": True}, headers={"Origin": "https://evil.example"})
    assert r.status_code == 403 and "--allow-origin https://evil.example" in r.json()["detail"]
    assert httpx.get(url + "/v1/state").json()["settings"]["paused"] is False
    r = httpx.get(url + "/v1/state", headers={"Origin": "null"})  # a sandboxed frame, a file: page
    assert r.status_code == 403
    # the server's own pages (its /docs) call it from its own origin
    assert httpx.get(url + "/v1/state", headers={"Origin": url}).status_code == 200


def test_the_flags_that_allow_a_host_and_an_origin():
    with served("--sim", SIM, "--allow-host", "box.lan", "--allow-origin", "http://localhost:3000") as s:
        assert _raw_get(s.url, "/v1/state", {"Host": "box.lan:8765"})[0] == 200
        assert _raw_get(s.url, "/v1/state", {"Host": "other.lan"})[0] == 403
        assert httpx.get(s.url + "/v1/state", headers={"Origin": "http://localhost:3000"}).status_code == 200
        assert httpx.get(s.url + "/v1/state", headers={"Origin": "http://localhost:3001"}).status_code == 403


def test_with_a_token_the_host_is_not_the_check():
    with served("--sim", SIM, "--token", "t0k") as s:
        assert _raw_get(s.url, "/v1/state", {"Host": "gpu-box.lan"})[0] == 401  # the token is
        assert _raw_get(s.url, "/v1/state", {"Host": "gpu-box.lan", "Authorization": "Bearer t0k"})[0] == 200


def test_the_api_can_hide_the_conversations():
    """Step records carry each agent's latest text (its tail); --hide-text keeps it off the API."""
    for flags, shown in (((), True), (("--hide-text",), False)):
        with served("--sim", SIM, *flags) as s:
            tails: list[str] = []
            for _ in range(100):
                step = httpx.get(s.url + "/v1/state").json()["step"]
                tails = [a["tail"] for a in (step or {}).get("agents", [])]
                if any(tails) or (not shown and step and step["step"] > 50):
                    break
                time.sleep(0.1)
            assert any(tails) is shown, tails
            with httpx.stream("GET", s.url + "/v1/steps?from=0&limit=20") as r:
                events = [json.loads(ln[5:]) for ln in r.iter_lines() if ln.startswith("data:")]
            assert events and any(a["tail"] for e in events for a in e["agents"]) is shown


def test_a_client_that_stops_reading_its_stream_holds_nothing(clients_server):
    """A streaming client that never reads: its replies wait in its own queue and socket, the engine steps
    on and serves the others."""
    url = clients_server.url
    host, port = url.split("//")[1].split(":")
    body = json.dumps({"messages": [{"role": "user", "content": "write on and on"}], "max_tokens": 300,
                       "stream": True})
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json"
                  f"\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode())  # and never read
    try:
        n0 = httpx.get(url + "/v1/state").json()["step"]["step"]
        t0 = time.monotonic()
        r = httpx.post(url + "/v1/chat/completions", timeout=30,
                       json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
        assert time.monotonic() - t0 < 20
        assert httpx.get(url + "/v1/state").json()["step"]["step"] > n0 + 8
    finally:
        sock.close()

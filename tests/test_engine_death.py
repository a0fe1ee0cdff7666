"""A dead engine is loud and bounded: killed mid-stream (its backend fails a step, as a driver error would),
every open request ends at once with an error event, step streams end with one, new requests and
/v1/models get a 503 in OpenAI's shape, /health says so, and serve's server stops (serve then exits 1).
The server runs in this process (so the test can break its engine), on a real loopback port."""

import threading
import time

import httpx
import openai
import pytest
import uvicorn

from swarmtune.commands.serve import stop_on_engine_death
from swarmtune.engine.agents.served import ServedAgents
from swarmtune.factories import make_engine
from swarmtune.parsing import build_parser
from swarmtune.server.runner import EngineRunner
from swarmtune.server.server import ApiServer, make_app
from tests.conftest import SIM, until


@pytest.fixture(params=["stays up", "serve's"])
def live_server(request):
    """A server whose engine will die: one that stays up after (as the dashboard's), and one wired as serve's
    (it stops)."""
    args = build_parser().parse_args(["serve", "--sim", SIM, "--clients", "--agents", "2", "--ctx", "2048"])
    engine = make_engine(args)
    assert isinstance(engine.workload, ServedAgents)
    runner = EngineRunner(engine, served=engine.workload)
    server = ApiServer(uvicorn.Config(make_app(runner, None, engine.workload), host="127.0.0.1", port=0,
                                      log_level="warning", timeout_graceful_shutdown=2), engine.workload)
    if request.param == "serve's":
        stop_on_engine_death(runner, server)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    assert until(lambda: server.started, timeout=30)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}", runner, request.param, thread
    server.should_exit = True
    thread.join(10)


def test_a_dead_engine_ends_every_wait_at_once(live_server, capfd):
    url, runner, kind, thread = live_server
    assert httpx.get(url + "/health").json() == {"status": "ok"}
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=30)
    stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "write a lot"}],
                                            max_tokens=1500, stream=True)
    steps = httpx.stream("GET", url + "/v1/steps", timeout=30)
    step_events = steps.__enter__()
    got_first = False
    err: Exception | None = None
    t_kill = None
    try:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content and not got_first:
                got_first = True

                def boom(*a, **k):
                    raise RuntimeError("injected: the driver lost the device")

                runner.engine.backend.steps.launch_decode = boom  # the next decode step fails, as a driver error would
                t_kill = time.monotonic()
    except openai.APIError as e:
        err = e
    assert got_first and t_kill is not None
    assert err is not None and "the engine stopped" in str(err) and "injected" in str(err), err
    assert time.monotonic() - t_kill < 5  # at once, not at a timeout
    # the step stream ends with an error event naming the cause
    lines = [ln for ln in step_events.iter_lines()]
    steps.__exit__(None, None, None)
    assert "event: error" in lines and any("injected" in ln for ln in lines if ln.startswith("data:")), lines[-4:]
    if kind == "serve's":
        # the server stops on its own (serve exits 1 after it), the cause in one line on stderr
        thread.join(15)
        assert not thread.is_alive() and runner.error and "injected" in runner.error
        err_lines = [ln for ln in capfd.readouterr().err.splitlines() if "the engine stopped" in ln]
        assert len(err_lines) == 1 and "injected" in err_lines[0] and "Traceback" not in err_lines[0]
        return
    # up still: new requests and the model list say so in OpenAI's shape; /health says so without the cause
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert e.value.status_code == 503 and "injected" in e.value.message
    r = httpx.get(url + "/v1/models")
    assert r.status_code == 503 and r.json()["error"]["code"] == "engine_stopped"
    assert httpx.get(url + "/health").json() == {"status": "error"}
    assert thread.is_alive()

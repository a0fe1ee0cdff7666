"""A real agent framework from PyPI (smolagents' ToolCallingAgent) runs four agents at once for a few
steps against `swarmtune serve --clients` on the default model. The model is too small to solve
anything: the protocol is what is tested. Its one tool records the command it was asked to run and
answers with a canned observation, so nothing the model writes ever runs on this machine."""

import threading

import httpx
import pytest

from tests.remote_helpers import served

pytestmark = [pytest.mark.model, pytest.mark.filterwarnings("ignore:Function .run_command. has decorators")]


def test_four_smolagents_run_against_the_server_without_a_protocol_error(tmp_path):
    smolagents = pytest.importorskip("smolagents")
    asked: list[str] = []

    @smolagents.tool
    def run_command(command: str) -> str:
        """Run a shell command in the repository and return what it prints.

        Args:
            command: the command line to run
        """
        asked.append(command)  # recorded, never run
        return f"$ {command}\n3 passed in 0.12s"

    # smolagents' own system prompt is about 1,800 tokens: room for it and a few steps
    with served("--clients", "--agents", "4", "--ctx", "6144", "--threads", "2", "--check") as s:
        errors: list[BaseException] = []
        steps: list[int] = []

        def agent(i: int) -> None:
            try:
                model = smolagents.OpenAIServerModel(model_id="smollm2", api_base=s.url + "/v1", api_key="x",
                                                     max_tokens=192, user=f"agent-{i}")
                a = smolagents.ToolCallingAgent(tools=[run_command], model=model, max_steps=3, verbosity_level=-1)
                a.run(f"Task {i}: run the test suite in {tmp_path} and report what it says.")
                steps.append(len(a.memory.steps))
            except BaseException as e:  # a protocol error surfaces here, as the client's exception
                errors.append(e)

        threads = [threading.Thread(target=agent, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        state = httpx.get(s.url + "/v1/state").json()
    assert not errors, errors
    assert len(steps) == 4 and all(n >= 2 for n in steps)  # the task and at least one model step each
    rows = state["step"]["agents"]
    assert len(rows) == 4 and {r["label"] for r in rows} == {f"agent-{i}" for i in range(4)}  # one row each
    assert state["error"] is None  # --check held

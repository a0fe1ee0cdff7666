"""The dashboard and the server in one process: `swarmtune run --clients`. The engine runs in the
dashboard's thread, as it does for a live run; its records also go to the HTTP readers, and the OpenAI
API feeds it the clients' requests. The dashboard's controls and the HTTP ones reach the same engine."""

import threading
from collections.abc import Callable
from typing import Any

import uvicorn

from swarmtune.engine.agents.served import ServedAgents
from swarmtune.engine.control import Control, EngineState
from swarmtune.server.bridge import ChatConfig
from swarmtune.server.runner import EngineRunner
from swarmtune.server.server import ApiServer, make_app
from swarmtune.sources.protocol import Capabilities, Sink


class HostedSource:
    capabilities = Capabilities(controls=True, pause=True, seek=False)

    def __init__(self, runner: EngineRunner, served: ServedAgents, host: str, port: int,
                 token: str | None, allow_hosts: tuple[str, ...] = (),
                 allow_origins: tuple[str, ...] = (), chat: ChatConfig | None = None) -> None:
        self.runner = runner
        runner.hosted = True
        self.served = served
        self.mode = "SIMULATED" if runner.engine.backend.source == "simulated" else ""
        self.url = f"http://{host}:{port}"
        app = make_app(runner, token, served, allow_hosts, allow_origins, chat)
        self.server = ApiServer(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                               timeout_graceful_shutdown=2), served)
        self._thread = threading.Thread(target=self.server.run, name="api", daemon=True)

    @property
    def status(self) -> str:
        url = self.url
        if self.server.started and self.server.servers and self.server.servers[0].sockets:
            host, port = self.server.servers[0].sockets[0].getsockname()[:2]  # --port 0 picks one
            url = f"http://{host}:{port}"
        return f"serving {url}/v1 · {self.served.busy_agents} busy, {self.served.queued} queued"

    @property
    def paused(self) -> bool:
        return self.runner.paused

    @paused.setter
    def paused(self, value: bool) -> None:
        self.runner.paused = value

    def header(self) -> dict[str, Any]:
        return self.runner.engine.header()

    def request(self, c: Control) -> EngineState:
        return self.runner.engine.request(c)

    def state(self) -> EngineState:
        return self.runner.engine.state()

    def run(self, sink: Sink, cancelled: Callable[[], bool]) -> None:
        self._thread.start()
        self.runner.run_into(sink, cancelled)

    def stop(self) -> None:
        self.server.should_exit = True

    def close(self) -> None:
        self.server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(5)
        self.runner.engine.close()
        if self.runner.recorder is not None:
            self.runner.recorder.close()

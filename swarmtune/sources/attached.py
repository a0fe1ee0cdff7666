"""An engine people already run (llama-server, vLLM), polled, as a read-only source."""

from collections.abc import Callable
from typing import Any

import httpx

from swarmtune.engine.control import Control, EngineState
from swarmtune.engine.errors import UserError
from swarmtune.sources.backoff import Backoff
from swarmtune.sources.pollers import ForeignPoller
from swarmtune.sources.protocol import Capabilities, Sink

POLL_EVERY_S = 0.5


class ForeignSource:
    capabilities = Capabilities(controls=False, pause=True, seek=False)

    def __init__(self, poller: ForeignPoller, interval_s: float = POLL_EVERY_S) -> None:
        self.poller = poller
        self.interval = Backoff(first_s=interval_s, max_s=interval_s)  # a steady pace between polls
        self.backoff = Backoff()
        self.paused = False
        self.status = ""
        self.mode = f"READ-ONLY {poller.engine}"

    def header(self) -> dict[str, Any]:
        return self.poller.header()

    def request(self, c: Control) -> EngineState:
        raise UserError(f"read-only: {self.poller.engine} is attached for viewing; its settings are its own")

    def state(self) -> EngineState:
        return EngineState(0, None, 0)

    def run(self, sink: Sink, cancelled: Callable[[], bool]) -> None:
        have_header = False
        while not cancelled():
            if self.paused:
                self.interval.wait(cancelled)
                continue
            try:
                if not have_header:
                    sink.header(self.poller.header())
                    have_header = True
                sink.records([self.poller.poll()])
                self.status = ""
                self.backoff.reset()
                self.interval.wait(cancelled)
            except (httpx.HTTPError, OSError, ValueError) as e:
                if cancelled():
                    return
                self.status = f"disconnected, retrying in {self.backoff.next_s:.1f} s ({type(e).__name__})"
                sink.records([])
                self.backoff.wait(cancelled)

    def stop(self) -> None:
        self.poller.close()

    def close(self) -> None:
        self.poller.close()

"""A `swarmtune serve` engine over HTTP as a source: records by Server-Sent Events, controls by POST.
A lost connection reads "disconnected, retrying" and resumes from the last step seen."""

import time
from collections.abc import Callable
from typing import Any

import httpx

from swarmtune.engine.control import Control, EngineState
from swarmtune.engine.errors import UserError
from swarmtune.engine.kv.types import KVSetting, known_kv
from swarmtune.engine.record.records import StepRecord
from swarmtune.engine.settings import DraftSetting
from swarmtune.sources.backoff import Backoff
from swarmtune.sources.client import SwarmClient
from swarmtune.sources.protocol import Capabilities, Sink


class RemoteSource:
    mode = "REMOTE"
    capabilities = Capabilities(controls=True, pause=True, seek=False)

    def __init__(self, client: SwarmClient, max_backoff_s: float = 5.0) -> None:
        self.client = client
        self.status = ""
        self.last_step = -1
        self.reconnects = 0
        self.missed = 0
        self.backoff = Backoff(max_s=max_backoff_s)
        self._settings = EngineState(0, None, 0)
        self._paused = False

    def header(self) -> dict[str, Any]:
        return self.client.info()

    @property
    def paused(self) -> bool:
        return self._paused

    @paused.setter
    def paused(self, value: bool) -> None:
        self._control(Control(), paused=value)

    def request(self, c: Control) -> EngineState:
        return self._control(c)

    def _control(self, c: Control, paused: bool | None = None) -> EngineState:
        try:
            s = self.client.control(**c.to_http(), paused=paused)
        except httpx.HTTPError as e:
            raise UserError(f"the remote engine did not answer: {e}") from None
        self._paused = s["paused"]
        self._settings = EngineState(s["batch_cap"], _remote_kv(s["kv_type"]), s["agents"], s.get("residency", "keep"),
                                     s.get("autotune"), _remote_draft(s.get("draft")))
        return self._settings

    def state(self) -> EngineState:
        return self._settings

    def run(self, sink: Sink, cancelled: Callable[[], bool]) -> None:
        run_id = None
        while not cancelled():
            try:
                info = self.client.info()
                if info.get("run_id") != run_id:
                    if run_id is not None:  # a restarted server counts its steps from 0 again
                        self.last_step = -1
                        self.status = "the remote engine restarted"
                    run_id = info.get("run_id")
                    sink.header(info)
                st = self.client.state()["settings"]
                self._settings = EngineState(st["batch_cap"], _remote_kv(st["kv_type"]), st["agents"],
                                             st.get("residency", "keep"), st.get("autotune"),
                                             _remote_draft(st.get("draft")))
                self._paused = st["paused"]
                self._stream(sink, cancelled)
            except (httpx.HTTPError, OSError, ValueError) as e:
                if cancelled():
                    return
                if isinstance(e, httpx.HTTPStatusError) and e.response.status_code == 401:
                    self.status = "unauthorized: pass --token"
                    sink.records([])
                    return
                self.reconnects += 1
                self.status = f"disconnected, retrying in {self.backoff.next_s:.1f} s"
                sink.records([])
                self.backoff.wait(cancelled)

    def _stream(self, sink: Sink, cancelled: Callable[[], bool]) -> None:
        buf: list[StepRecord] = []
        last_emit = time.perf_counter()
        start = self.last_step + 1 if self.last_step >= 0 else None
        for rec in self.client.steps(from_step=start):
            if self.status.startswith("disconnected"):
                self.status = ""
            self.backoff.reset()
            if self.last_step >= 0 and rec.step > self.last_step + 1:
                self.missed += rec.step - self.last_step - 1
                self.status = f"missed {self.missed} steps (a slow link; the server dropped them)"
            self.last_step = rec.step
            self._settings = EngineState(rec.batch_cap, _remote_kv(rec.kv_type), len(rec.agents))
            buf.append(rec)
            now = time.perf_counter()
            if now - last_emit >= sink.every_s:
                sink.records(buf)
                buf, last_emit = [], now
            if cancelled():
                return
        if buf:
            sink.records(buf)

    def stop(self) -> None:
        self.client.close()  # unblocks a read waiting on the network

    def close(self) -> None:
        self.client.close()


def _remote_kv(text: object) -> KVSetting | None:
    """The remote engine's KV setting as it spelled it; None where it did not say or said what this
    version cannot read (a newer type): shown as unknown, never a dead screen."""
    try:
        return known_kv(str(text))
    except UserError:
        return None


def _remote_draft(value: object) -> DraftSetting | None:
    """The remote engine's speculation setting; None where it did not say (an older server) or said what this
    version cannot read."""
    if value is None:
        return None
    try:
        return DraftSetting.parse(value)
    except UserError:
        return None

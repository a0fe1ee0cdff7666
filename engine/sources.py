"""Where the dashboard's step records come from: a live engine, a recording, or (later) a remote engine.

A source runs in the app's worker thread and hands records to `emit`; controls go through `request`,
which raises UserError when the source cannot honour them (a replay is read-only)."""

import threading
import time
from collections.abc import Callable

from engine.engine import Engine, EngineState
from engine.errors import UserError
from engine.pacing import Pacer
from engine.records import Recording, StepRecord

Emit = Callable[[list[StepRecord]], None]
UI_INTERVAL_S = 0.1  # at most ~10 batches of records a second reach the UI


class LiveSource:
    mode = ""
    read_only = False

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.paused = False
        if engine.backend.source == "simulated":
            self.mode = "SIMULATED"

    def header(self) -> dict:
        return self.engine.header()

    def request(self, **kw) -> EngineState:
        return self.engine.request(**kw)

    def state(self) -> EngineState:
        return self.engine.state()

    def run(self, emit: Emit, cancelled: Callable[[], bool], progress: Callable[[str, int, int], None],
            on_header: Callable[[dict], None]) -> None:
        eng = self.engine
        eng.progress = progress
        if not eng.started:
            eng.start()
        on_header(eng.header())
        buf: list[StepRecord] = []
        last = time.perf_counter()
        # simulated time plays at wall-clock pace, or it outruns any screen
        pacer = Pacer() if eng.backend.source == "simulated" else None
        while not cancelled():
            if self.paused:
                time.sleep(0.05)
                if pacer:
                    pacer.reset()
                continue
            rec = eng.step()
            buf.append(rec)
            if pacer:
                pacer.wait(rec.t)
            now = time.perf_counter()
            if now - last >= UI_INTERVAL_S:
                emit(buf)
                buf, last = [], now

    def close(self) -> None:
        self.engine.close()


class ReplaySource:
    """Plays a recording at its recorded pace times `speed`; pause, single step and seek."""

    mode = "REPLAY"
    read_only = True

    def __init__(self, recording: Recording, speed: float = 1.0) -> None:
        self.rec = recording
        self.pacer = Pacer(speed, max_sleep_s=0.5)  # short sleeps: a pause or seek answers promptly
        self.paused = False
        self.position = 0  # index of the next record to play
        self._lock = threading.Lock()
        self._jump: int | None = None
        self._single = 0

    @property
    def speed(self) -> float:
        return self.pacer.speed

    @speed.setter
    def speed(self, value: float) -> None:
        self.pacer.speed = value

    def header(self) -> dict:
        return self.rec.header

    def request(self, **kw) -> EngineState:
        raise UserError("replay is read-only: the recording's settings cannot change")

    def state(self) -> EngineState:
        last = self.rec.steps[max(0, self.position - 1)] if self.rec.steps else None
        return EngineState(last.batch_cap if last else 0, last.kv_type if last else "", len(last.agents) if last else 0)

    def seek(self, index: int) -> None:
        with self._lock:
            self._jump = max(0, min(index, len(self.rec.steps)))

    def step_once(self) -> None:
        with self._lock:
            self._single += 1

    def run(self, emit: Emit, cancelled: Callable[[], bool], progress: Callable[[str, int, int], None],
            on_header: Callable[[dict], None], on_seek: Callable[[list[StepRecord]], None] | None = None) -> None:
        on_header(self.rec.header)
        steps = self.rec.steps
        buf: list[StepRecord] = []
        last_emit = time.perf_counter()
        while not cancelled():
            with self._lock:
                jump, self._jump = self._jump, None
                single = self._single > 0
                if single:
                    self._single -= 1
            if jump is not None:
                self.position = jump
                if on_seek is not None:
                    on_seek(steps[:jump])
                self.pacer.reset()
                buf = []
            if self.position >= len(steps) or (self.paused and not single):
                if buf:
                    emit(buf)
                    buf = []
                time.sleep(0.03)
                self.pacer.reset()
                continue
            r = steps[self.position]
            self.position += 1
            buf.append(r)
            if not single:
                self.pacer.wait(r.t)
            now = time.perf_counter()
            if single or now - last_emit >= UI_INTERVAL_S:
                emit(buf)
                buf, last_emit = [], now

    def close(self) -> None:
        pass


def _sleep_unless(cancelled: Callable[[], bool], seconds: float) -> None:
    end = time.perf_counter() + seconds
    while not cancelled() and time.perf_counter() < end:
        time.sleep(0.05)


class RemoteSource:
    """A `swarmtune serve` engine over HTTP: records by Server-Sent Events, controls by POST.
    A lost connection reads "disconnected, retrying" and resumes from the last step seen."""

    mode = "REMOTE"
    read_only = False

    def __init__(self, client, max_backoff_s: float = 5.0) -> None:
        from engine.remote.client import SwarmClient

        self.client: SwarmClient = client
        self.status = ""
        self.last_step = -1
        self.reconnects = 0
        self.missed = 0
        self.max_backoff_s = max_backoff_s
        self._settings = EngineState(0, "", 0)
        self._paused = False

    def header(self) -> dict:
        return self.client.info()

    @property
    def paused(self) -> bool:
        return self._paused

    @paused.setter
    def paused(self, value: bool) -> None:
        self.request(paused=value)

    def request(self, batch_cap: int | None = None, kv: str | None = None, agents: int | None = None,
                paused: bool | None = None) -> EngineState:
        import httpx

        try:
            s = self.client.control(batch_cap=batch_cap, kv_type=kv, agents=agents, paused=paused)
        except httpx.HTTPError as e:
            raise UserError(f"the remote engine did not answer: {e}") from None
        self._paused = s["paused"]
        self._settings = EngineState(s["batch_cap"], s["kv_type"], s["agents"])
        return self._settings

    def state(self) -> EngineState:
        return self._settings

    def run(self, emit: Emit, cancelled: Callable[[], bool], progress: Callable[[str, int, int], None],
            on_header: Callable[[dict], None]) -> None:
        import httpx

        backoff, run_id = 0.5, None
        while not cancelled():
            try:
                info = self.client.info()
                if info.get("run_id") != run_id:
                    if run_id is not None:  # a restarted server counts its steps from 0 again
                        self.last_step = -1
                        self.status = "the remote engine restarted"
                    run_id = info.get("run_id")
                    on_header(info)
                st = self.client.state()["settings"]
                self._settings = EngineState(st["batch_cap"], st["kv_type"], st["agents"])
                self._paused = st["paused"]
                buf: list[StepRecord] = []
                last_emit = time.perf_counter()
                start = self.last_step + 1 if self.last_step >= 0 else None
                for rec in self.client.steps(from_step=start):
                    if self.status.startswith("disconnected"):
                        self.status = ""
                    backoff = 0.5
                    if self.last_step >= 0 and rec.step > self.last_step + 1:
                        gap = rec.step - self.last_step - 1
                        self.missed += gap
                        self.status = f"missed {self.missed} steps (a slow link; the server dropped them)"
                    self.last_step = rec.step
                    self._settings = EngineState(rec.batch_cap, rec.kv_type, len(rec.agents))
                    buf.append(rec)
                    now = time.perf_counter()
                    if now - last_emit >= UI_INTERVAL_S:
                        emit(buf)
                        buf, last_emit = [], now
                    if cancelled():
                        return
                if buf:
                    emit(buf)
            except (httpx.HTTPError, OSError, ValueError) as e:
                if cancelled():
                    return
                if isinstance(e, httpx.HTTPStatusError) and e.response.status_code == 401:
                    self.status = "unauthorized: pass --token"
                    emit([])
                    return
                self.reconnects += 1
                self.status = f"disconnected, retrying in {backoff:.1f} s"
                emit([])
                _sleep_unless(cancelled, backoff)
                backoff = min(backoff * 2, self.max_backoff_s)

    def close(self) -> None:
        self.client.close()


class ForeignSource:
    """llama-server or vLLM, polled; read-only."""

    read_only = True

    def __init__(self, poller, interval_s: float = 0.5) -> None:
        self.poller = poller
        self.interval_s = interval_s
        self.paused = False
        self.status = ""
        self.mode = f"READ-ONLY {poller.engine}"

    def header(self) -> dict:
        return self.poller.header()

    def request(self, **kw) -> EngineState:
        raise UserError(f"read-only: {self.poller.engine} is attached for viewing; its settings are its own")

    def state(self) -> EngineState:
        return EngineState(0, "remote", 0)

    def run(self, emit: Emit, cancelled: Callable[[], bool], progress: Callable[[str, int, int], None],
            on_header: Callable[[dict], None]) -> None:
        import httpx

        backoff, have_header = 0.5, False
        while not cancelled():
            if self.paused:
                time.sleep(0.05)
                continue
            try:
                if not have_header:
                    on_header(self.poller.header())
                    have_header = True
                emit([self.poller.poll()])
                self.status = ""
                backoff = 0.5
                _sleep_unless(cancelled, self.interval_s)
            except (httpx.HTTPError, OSError, ValueError) as e:
                self.status = f"disconnected, retrying in {backoff:.1f} s ({type(e).__name__})"
                emit([])
                _sleep_unless(cancelled, backoff)
                backoff = min(backoff * 2, 5.0)

    def close(self) -> None:
        self.poller.close()

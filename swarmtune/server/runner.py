"""The engine in a thread of its own, its records kept and fanned out to any number of readers.

A reader gets a bounded queue; when a slow reader's queue is full the oldest record is dropped, so a
stuck client can never stall the engine (the client sees the gap in step indexes).

If the engine dies, it says so at once everywhere a client waits: every served request ends with an error,
every step stream with an error event (step DIED), and `on_death` hears the cause (serve logs it and exits
non-zero, for a supervisor to restart it)."""

import asyncio
import json
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from swarmtune.engine.agents.served import ServedAgents
from swarmtune.engine.engine import Engine
from swarmtune.engine.measure.rolling import RollingRate
from swarmtune.engine.record.records import RecordWriter, StepRecord
from swarmtune.server.outbox import Outbox
from swarmtune.sources.live import LiveSource
from swarmtune.sources.protocol import Sink

DIED = -1  # the step index of the last item a step stream gets when the engine died: its data is the cause


@dataclass(eq=False)
class Subscriber:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[tuple[int, str]]
    dropped: int = 0

    def push(self, item: tuple[int, str]) -> None:
        """Called from the engine thread: never blocks."""
        self.loop.call_soon_threadsafe(self._put, item)

    def _put(self, item: tuple[int, str]) -> None:
        if self.queue.full():
            self.queue.get_nowait()
            self.dropped += 1
        self.queue.put_nowait(item)


class EngineRunner:
    def __init__(self, engine: Engine, history: int = 4096, queue_size: int = 256, pace_sim: bool = True,
                 served: ServedAgents | None = None, record_path: str | None = None, hide_text: bool = False) -> None:
        self.engine = engine
        self.hide_text = hide_text  # the API's step records carry no conversation text (the record file does)
        self.served = served  # the HTTP clients' agents, when the engine serves them
        # every step and every served request, each line flushed as written
        self.recorder = RecordWriter(record_path) if record_path else None
        self.requests_total = 0
        # simulated time at wall-clock pace, unless a benchmark wants the engine's full rate
        self.source = LiveSource(engine, pace_sim=pace_sim)
        self.history: deque[tuple[int, str]] = deque(maxlen=history)
        self.latest: StepRecord | None = None
        self.latest_decode: StepRecord | None = None
        self.header: dict[str, Any] = {}
        self.rolling = RollingRate()
        self.queue_size = queue_size
        self.error: str | None = None
        self.on_death: Callable[[str], None] | None = None  # called once, in the engine's thread, with the cause
        self.ready = threading.Event()
        self._subs: set[Subscriber] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._outboxes: list[Outbox] = []  # served tokens, sent to each loop once a step
        self._engine_thread: int | None = None

    def start(self) -> None:
        self._thread.start()

    @property
    def running(self) -> bool:
        """Its engine runs (in its own thread, or in a host's: the dashboard's)."""
        return self._thread.is_alive() or self.hosted

    hosted = False  # the engine runs in a host's thread (run_into), not the runner's own

    @property
    def paused(self) -> bool:
        return self.source.paused

    @paused.setter
    def paused(self, value: bool) -> None:
        self.source.paused = value

    def _run(self) -> None:
        self.run_into(None, self._stop.is_set)

    def run_into(self, sink: Sink | None, cancelled: Callable[[], bool]) -> None:
        """Run the engine in the calling thread: its records go to the HTTP readers and the recording, and to
        `sink` as well (the dashboard, when it hosts the server in its own process)."""
        def records(recs: list[StepRecord]) -> None:
            self._publish(recs)
            if sink is not None:
                sink.records(recs)

        def header(h: dict[str, Any]) -> None:
            self._started(h)
            if sink is not None:
                sink.header(h)

        self._engine_thread = threading.get_ident()
        for box in self._outboxes:
            box.hold_thread = self._engine_thread
        own = Sink(records=records, header=header)
        if sink is not None:
            own.progress, own.every_s = sink.progress, sink.every_s
        try:
            self.source.run(own, cancelled=lambda: cancelled() or self._stop.is_set())
        except Exception as e:  # never a dead thread in silence
            self.error = f"{type(e).__name__}: {e}"
            self._died()
            if sink is not None:
                raise
        finally:
            self._flush()
            self.ready.set()

    def outbox_for(self, loop: asyncio.AbstractEventLoop) -> Outbox:
        """The outbox a server loop's streams read through; this runner wakes it after each step."""
        with self._lock:
            box = next((b for b in self._outboxes if b.loop is loop), None)
            if box is None:
                box = Outbox(loop)
                box.hold_thread = self._engine_thread
                self._outboxes.append(box)
        return box

    def _flush(self) -> None:
        with self._lock:
            boxes = list(self._outboxes)
        for box in boxes:
            try:
                box.flush()
            except RuntimeError:  # that loop is closed: nobody is listening there
                pass

    def _died(self) -> None:
        """Every waiting client hears it now: served requests end with an error, step streams with one."""
        msg = f"the engine stopped: {self.error}"
        if self.served is not None:
            self.served.close_all(msg)
            self._flush()
        with self._lock:
            subs = list(self._subs)
        for s in subs:
            s.push((DIED, json.dumps({"error": msg})))
        if self.on_death is not None:
            self.on_death(msg)

    def _started(self, header: dict[str, Any]) -> None:
        self.header = header
        if self.recorder is not None:
            self.recorder.open(header)
        self.ready.set()

    def _publish(self, records: list[StepRecord]) -> None:
        # each agent's view serialized once for the file and every reader (twice only where the API hides the
        # text); the file's line carries the views that changed (records.RecordWriter), the API's all of them
        lines = [r.to_json() for r in records]
        if self.recorder is not None:
            for r in records:
                self.recorder.write(r)
        if self.served is not None:
            done = self.served.drain_records()
            self.requests_total += len(done)
            if self.recorder is not None:
                for q in done:
                    self.recorder.write(q)
        for r, whole in zip(records, lines, strict=True):
            line = self.public_json(r) if self.hide_text else whole
            with self._lock:
                self.history.append((r.step, line))
                self.latest = r
                if r.kind == "decode" and not r.reference:  # a batch-1 reference step is not the swarm's state
                    self.latest_decode = r
                self.rolling.add(r)
                subs = list(self._subs)
            for s in subs:
                s.push((r.step, line))
        self._flush()  # the step's tokens, to every stream at once

    def public_json(self, r: StepRecord) -> str:
        """A step record as the API shows it: without each agent's text where the server hides it."""
        if self.hide_text:
            r = replace(r, agents=[replace(a, tail="") for a in r.agents])
        return r.to_json()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop stepping and wait for the step in flight: the engine is freed only after."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self.engine.close()
            if self.recorder is not None:
                self.recorder.close()

    def subscribe(self, loop: asyncio.AbstractEventLoop) -> Subscriber:
        s = Subscriber(loop, asyncio.Queue(self.queue_size))
        with self._lock:
            self._subs.add(s)
        return s

    def unsubscribe(self, s: Subscriber) -> None:
        with self._lock:
            self._subs.discard(s)

    def since(self, step: int) -> list[tuple[int, str]]:
        with self._lock:
            return [x for x in self.history if x[0] >= step]

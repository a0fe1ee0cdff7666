"""The one paced loop that drives a source which makes its own records (a live engine, a recording):
take the next record while not cancelled, hold while paused, play record time at wall-clock pace when
asked, and hand records to the sink in batches. `record`, the dashboard and `serve` all run on it."""

import time
from collections.abc import Callable

from swarmtune.engine.errors import Interrupted
from swarmtune.engine.record.records import StepRecord
from swarmtune.sources.pacing import Pacer
from swarmtune.sources.protocol import Sink

IDLE_S = 0.03  # how often a paused or exhausted source looks again


class Seeked:
    """What next_record() returns after a seek: the records not yet handed over belong to the old position."""


SEEKED = Seeked()


def drive(next_record: Callable[[], StepRecord | Seeked | None], sink: Sink, cancelled: Callable[[], bool],
          paused: Callable[[], bool], pacer: Pacer | None = None, on_held: Callable[[], None] | None = None) -> None:
    """next_record() returns None when it has nothing now (a replay at its end), SEEKED after a seek.
    on_held: called each time a pause holds (no step in flight, every record handed over)."""
    buf: list[StepRecord] = []
    last = time.perf_counter()

    def flush() -> None:
        nonlocal buf, last
        if buf:
            sink.records(buf)
        buf, last = [], time.perf_counter()

    try:
        while not cancelled():
            held = paused()
            rec = None if held else next_record()
            if isinstance(rec, Seeked):
                buf = []
                continue
            if rec is None:
                flush()
                if held and on_held is not None:
                    on_held()
                time.sleep(IDLE_S)
                if pacer:
                    pacer.reset()
                continue
            buf.append(rec)
            if time.perf_counter() - last >= sink.every_s:
                flush()
            if pacer:  # a pause that arrives while it waits ends the wait: one simulated step can be
                # seconds long (histories rebuilt after a residency switch) and the pause answers once held
                pacer.wait(rec.t, lambda: cancelled() or paused())
    except Interrupted:  # asked to stop in the middle of a long step
        pass
    finally:
        flush()

"""Events from the engine's thread to the server's event loop, one wake-up for a step's worth of them.

`loop.call_soon_threadsafe` writes a byte to the loop's self-pipe on every call: one per token per stream
was the engine thread's largest per-agent cost after sampling (bench/host_overhead.py, "other"). An
outbox queues the events; the engine's own thread (`hold_thread`) only queues them, and its runner wakes
the loop once after each step (`flush`); any other thread (a server closing, a client leaving) wakes it at
once. Each queue gets its events in the order they were made."""

import asyncio
import threading
from collections import deque
from typing import Any


class Outbox:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._items: deque[tuple[asyncio.Queue[Any], Any]] = deque()
        self._scheduled = False
        self.hold_thread: int | None = None  # the engine's: its events wait for flush()

    def put(self, q: "asyncio.Queue[Any]", event: Any) -> None:
        """Any thread. Raises RuntimeError where the loop is closed (nobody is listening)."""
        self._items.append((q, event))
        if threading.get_ident() != self.hold_thread:
            self.flush()

    def flush(self) -> None:
        """Wake the loop for what is queued (once, until it has drained it)."""
        if self._items and not self._scheduled:
            self._scheduled = True
            try:
                self.loop.call_soon_threadsafe(self._drain)
            except RuntimeError:
                self._scheduled = False
                raise

    def _drain(self) -> None:
        # cleared before draining: an event put after this line wakes the loop again, none is left behind
        self._scheduled = False
        items = self._items
        while items:
            q, event = items.popleft()
            q.put_nowait(event)

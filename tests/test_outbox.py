"""The engine thread's events reach the server's loop in order, with one wake-up per step."""

import asyncio
import threading

import pytest

from swarmtune.server.outbox import Outbox


def _counting(box: Outbox) -> list[int]:
    wakes = [0]
    drain = box._drain

    def counted() -> None:
        wakes[0] += 1
        drain()

    box._drain = counted  # type: ignore[method-assign]
    return wakes


def test_a_steps_tokens_from_the_engine_thread_wake_the_loop_once():
    async def main() -> tuple[list[list[int]], int]:
        box = Outbox(asyncio.get_running_loop())
        wakes = _counting(box)
        queues: list[asyncio.Queue[int]] = [asyncio.Queue() for _ in range(8)]

        def engine() -> None:  # 8 streams x 50 steps; the runner flushes after each step
            box.hold_thread = threading.get_ident()
            for t in range(50):
                for q in queues:
                    box.put(q, t)
                box.flush()

        th = threading.Thread(target=engine)
        th.start()
        th.join()
        got = [[await asyncio.wait_for(q.get(), 5) for _ in range(50)] for q in queues]
        return got, wakes[0]

    got, wakes = asyncio.run(main())
    assert got == [list(range(50))] * 8
    assert wakes <= 50  # at most one per step, not one per token (400)


def test_an_event_from_any_other_thread_goes_at_once():
    async def main() -> str:
        box = Outbox(asyncio.get_running_loop())
        box.hold_thread = -1  # the engine is some other thread
        q: asyncio.Queue[str] = asyncio.Queue()
        th = threading.Thread(target=box.put, args=(q, "closed"))  # a server closing: no flush will follow
        th.start()
        th.join()
        return await asyncio.wait_for(q.get(), 5)

    assert asyncio.run(main()) == "closed"


def test_a_closed_loop_is_said_not_hidden():
    loop = asyncio.new_event_loop()
    box = Outbox(loop)
    loop.close()
    with pytest.raises(RuntimeError):
        box.put(asyncio.Queue(), 1)
    with pytest.raises(RuntimeError):  # and the next put tries again rather than waiting for a drain
        box.put(asyncio.Queue(), 2)

"""The engine thread's events reach the server's loop in order, with one wake-up per burst."""

import asyncio
import threading

import pytest

from swarmtune.server.outbox import Outbox


def test_a_burst_from_another_thread_arrives_in_order_with_one_wakeup():
    async def main() -> tuple[list[list[int]], int]:
        loop = asyncio.get_running_loop()
        box = Outbox(loop)
        wakes = 0
        drain = box._drain

        def counted() -> None:
            nonlocal wakes
            wakes += 1
            drain()

        box._drain = counted  # type: ignore[method-assign]
        queues: list[asyncio.Queue[int]] = [asyncio.Queue() for _ in range(8)]

        def engine_step() -> None:  # 8 streams x 50 tokens, as one step's worth each time
            for t in range(50):
                for q in queues:
                    box.put(q, t)

        th = threading.Thread(target=engine_step)
        th.start()
        th.join()
        got = [[await asyncio.wait_for(q.get(), 5) for _ in range(50)] for q in queues]
        return got, wakes

    got, wakes = asyncio.run(main())
    assert got == [list(range(50))] * 8
    assert wakes == 1  # the loop slept through the whole burst: one pipe write, not 400


def test_a_closed_loop_is_said_not_hidden():
    loop = asyncio.new_event_loop()
    box = Outbox(loop)
    loop.close()
    with pytest.raises(RuntimeError):
        box.put(asyncio.Queue(), 1)
    with pytest.raises(RuntimeError):  # and the next put tries again rather than waiting for a drain
        box.put(asyncio.Queue(), 2)

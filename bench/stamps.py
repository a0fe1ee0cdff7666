"""The same range of steps, timed where the engine makes them: an overhead bench compares like with like.

The swarm's workload is deterministic under its seed, but its phases are not alike (a burst of tool
results is prefill, then decode runs again): two runs timed over different windows of it differ by 20%
with no overhead at all. So each run stamps every step as it leaves the engine, and the decode rate is
taken over one fixed step range in both."""

import threading
import time

from swarmtune.engine.engine import Engine


def on_own_thread(fn, *args):
    """fn(*args) on a thread that ends with it, taking its OpenMP pool along: llama.cpp's CPU backend keeps
    one pool per thread that ever decoded, and two alive in one process (more threads than cores) make
    libgomp sleep at its barriers, which cost 10-15% here. The real commands decode on one thread only."""
    out = []
    t = threading.Thread(target=lambda: out.append(fn(*args)))
    t.start()
    t.join()
    return out[0]


class Stamps:
    def __init__(self, engine: Engine) -> None:
        self.at: dict[int, float] = {}  # step -> perf_counter when its record left the engine
        self.tokens: dict[int, int] = {}  # step -> decode tokens
        step = engine.step

        def stamped():
            r = step()
            self.at[r.step] = time.perf_counter()
            self.tokens[r.step] = r.tokens if r.kind == "decode" else 0
            return r

        engine.step = stamped

    def reached(self, step: int) -> bool:
        return step in self.at

    def rate(self, first: int, last: int) -> float:
        """Decode tokens per second over steps first+1..last (timed from the end of step first)."""
        tokens = sum(self.tokens[s] for s in range(first + 1, last + 1))
        return tokens / (self.at[last] - self.at[first])

"""Whether a decode step carries the next prefill chunk in the same llama_decode (llama-server's way) or the chunk
runs as a step of its own, decided by what the backend in use measured.

A decode step is bound by the weight stream, a prefill chunk by compute: on a GPU a chunk riding a decode
step fills compute the step leaves idle and saves a weight read, on this CPU one call was 1.03-1.10x as long
as two (bench/mixed_step.py). Which holds is the device's answer, so the engine asks it: now and then a step
mixes, and its seconds are compared with what the two calls would have taken by the run's own fits (the
decode step's, engine/measure/step_model.py, and the chunk's, engine/measure/chunk_fit.py). Mixing holds
while the median of the latest comparisons beats the two calls by MARGIN; otherwise it is tried again, less
often each time it lost. A fixed setting (--mix on|off) skips the measuring; auto measures where steps run
on a device (the launch returns before the step ends) and keeps the CPU's answer, two calls, on the CPU.
"""

import statistics
from collections import deque

from swarmtune.engine.agents.agent import Agent
from swarmtune.engine.backends.backend import Backend
from swarmtune.engine.measure.analysis import StepAnalysis
from swarmtune.engine.settings import EngineSettings

MARGIN = 1.03  # one call must beat the two calls' predicted seconds by 3%: less is within a fit's error
SAMPLES = 9  # the latest mixed steps compared
FIRST_TRY_EVERY = 8  # chances (a chunk due while agents decode) between tries while it does not pay
MAX_TRY_EVERY = 512


class MixPolicy:
    def __init__(self, backend: Backend, settings: EngineSettings, analysis: StepAnalysis) -> None:
        self.backend = backend
        self.s = settings  # the engine's own, as they are now
        self.analysis = analysis
        self.ratios: deque[float] = deque(maxlen=SAMPLES)  # a mixed step's seconds over the two calls' predicted
        self.chances = 0
        self.next_try = 0
        self.every = FIRST_TRY_EVERY

    @property
    def measuring(self) -> bool:
        return self.s.mix is None and self.backend.caps.launches_async and self.backend.caps.mix is None

    def pays(self) -> bool:
        return len(self.ratios) >= 3 and statistics.median(self.ratios) * MARGIN < 1

    def chunk(self, batch: list[Agent], a: Agent, chunk: int) -> int:
        """How many of a's next `chunk` prefill tokens a decode step of `batch` carries (0: none, the chunk
        runs as its own step)."""
        n = min(chunk, self.backend.max_chunk_tokens - len(batch))
        if n <= 0 or self.s.mix is False or (self.s.mix is None and not self.measuring):
            return 0
        if self.s.mix or self.pays():
            return n
        if self.two_calls_s(batch, n, a.context) is None:
            return 0  # a try is compared with the two calls' fits: none before they exist
        if len(self.ratios) < 3:
            return n  # the first tries: at every chance until there is a verdict
        self.chances += 1
        if self.chances < self.next_try:
            return 0
        self.next_try = self.chances + self.every
        self.every = min(self.every * 2, MAX_TRY_EVERY)
        return n

    def two_calls_s(self, batch: list[Agent], n: int, pos0: int) -> float | None:
        """What the decode step and the chunk would take as two calls, by the run's fits; None before both exist."""
        kv = self.s.kv
        fit, chunk = self.analysis.fit(kv), self.analysis.chunk_seconds(kv, n, pos0)
        if fit is None or chunk is None:
            return None
        contexts = [x.context + 1 for x in batch]
        return fit.step_seconds(len(batch), float(sum(contexts)), float(max(contexts))) + chunk

    def observed(self, seconds: float, batch: list[Agent], n: int, pos0: int) -> None:
        """A mixed step took `seconds` (batch as it was fed, n prefill tokens from pos0)."""
        if not self.measuring or seconds <= 0:
            return
        two = self.two_calls_s(batch, n, pos0)
        if two is not None and two > 0:
            self.ratios.append(seconds / two)
            if self.pays():
                self.every = FIRST_TRY_EVERY  # a loss later is tried again soon

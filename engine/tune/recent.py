"""The swarm's last steps and the setting each ran at: what an experiment measures the run's noise on
before its first block (engine/tune/experiment.py's Noise)."""

from collections import deque

from swarmtune.engine.record.records import StepRecord
from swarmtune.engine.tune.goal import Setting

# the incumbent's steps before an experiment that measure the run's noise (engine seconds): enough blocks
# for a few differences, not so long ago that the swarm was another
NOISE_WINDOW_S = 40.0


class RecentSteps:
    def __init__(self) -> None:
        self._steps: deque[tuple[StepRecord, Setting]] = deque()

    def add(self, rec: StepRecord, setting: Setting) -> None:
        self._steps.append((rec, setting))
        while self._steps and self._steps[0][0].t < rec.t - NOISE_WINDOW_S:
            self._steps.popleft()

    def at(self, setting: Setting) -> list[StepRecord]:
        """The last steps, oldest first, since the setting last moved to this one (no rebuild among them)."""
        out: list[StepRecord] = []
        for rec, s in reversed(self._steps):
            if s != setting or rec.kind == "rebuild":
                break
            out.append(rec)
        return out[::-1]

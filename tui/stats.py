"""What the dashboard shows, folded from step records: rolling rates, histories, the latest state.
Pure Python (no widgets), so replay, attach and the live engine share it."""

from collections import deque
from dataclasses import dataclass, field

from swarmtune.engine.records import StepRecord
from swarmtune.engine.rolling import RollingRate

HISTORY = 240


@dataclass
class Stats:
    header: dict = field(default_factory=dict)
    latest: StepRecord | None = None
    latest_decode: StepRecord | None = None
    steps: int = 0
    batch_history: deque = field(default_factory=lambda: deque(maxlen=HISTORY))  # (step, batch, cap, waiting)
    measured_points: deque = field(default_factory=lambda: deque(maxlen=400))  # (mean context, speedup, batch)
    rate: RollingRate = field(default_factory=RollingRate)
    agent_rate: dict = field(default_factory=dict)  # id -> deque of (t, generated)
    joules: float = 0.0
    energy_tokens: int = 0
    rebuild_note: str = ""
    tuner_on: bool = False  # the source's tuner holds the settings (the app sets it from the source's state)
    # what the tuner has spent (its last `cost` record: thinking, probes, switches, in engine seconds) and when
    tuner_spent_s: float | None = None
    tuner_spent_at_s: float = 0.0
    tuner_trying: str = ""  # the setting an experiment is trying now, if one runs

    def reset(self) -> None:
        header = self.header
        self.__init__()  # type: ignore[misc]
        self.header = header

    def add(self, r: StepRecord) -> None:
        self.latest = r
        self.steps += 1
        t = r.t
        self.rate.add(r)
        waiting = sum(1 for a in r.agents if a.state in ("waiting", "prefilling", "preempted"))
        at_tool = sum(1 for a in r.agents if a.state in ("tool", "client"))
        if r.kind == "decode" and not r.reference:  # a batch-1 reference step is not where the swarm is
            self.latest_decode = r
            self.batch_history.append((r.step, r.batch, r.batch_cap, waiting, at_tool))
            if r.measured_speedup is not None:
                self.measured_points.append((r.mean_context, r.measured_speedup, r.batch))
        if r.kind == "decode" and r.joules is not None:  # every decode's energy, reference steps' too
            self.joules += r.joules
            self.energy_tokens += r.tokens
        if r.kind == "rebuild":
            self.rebuild_note = r.note
        if r.kind == "tune" and r.tune is not None:
            self._tune(r)
        for a in r.agents:
            d = self.agent_rate.setdefault(a.id, deque(maxlen=64))
            d.append((t, a.generated))

    def _tune(self, r: StepRecord) -> None:
        d = r.tune.to_json() if r.tune is not None else {}
        if d.get("phase") == "cost":
            self.tuner_spent_s = d["think_s"] + d["probe_s"] + d["switch_s"]
            self.tuner_spent_at_s = r.t
        elif d.get("phase") == "trial":
            to, fr = d["to"], d["from"]
            self.tuner_trying = ", ".join(f"{'KV ' if k == 'kv' else k.replace('batch_cap', 'cap ')}{to[k]}"
                                          for k in ("batch_cap", "kv", "residency") if to[k] != fr[k])
        elif d.get("phase") == "experiment":
            self.tuner_trying = ""

    @property
    def tokens_per_second(self) -> float:
        return self.rate.tokens_per_second

    @property
    def steps_per_second(self) -> float:
        return self.rate.steps_per_second

    def agent_tokens_per_second(self, agent_id: int) -> float:
        d = self.agent_rate.get(agent_id)
        if not d or len(d) < 2 or d[-1][0] <= d[0][0]:
            return 0.0
        return (d[-1][1] - d[0][1]) / (d[-1][0] - d[0][0])

    @property
    def joules_per_token(self) -> float | None:
        return self.joules / self.energy_tokens if self.energy_tokens and self.joules > 0 else None

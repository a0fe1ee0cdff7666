"""What the dashboard folds of latency from the steps, measured on the engine's clock:
- every decoding agent's inter-token gaps (a step that generated n tokens for it, n gaps of its time since its
  last token), so a prefill held between two decode steps shows as the decoding agents' longer gaps, served or
  synthetic alike; the first token of a turn has no gap (what came before it was a tool or a client);
- the served requests that ended (their step's `ended`): queue wait, prefill time, time to first token;
- when a stall bound (--max-stall-ms) last held a prefill back, and by how much (the prefill step's note).
Percentiles over a recent window, nearest rank: what a p99 of the last 1,024 gaps means, no interpolation."""

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from swarmtune.engine.record.records import RequestLatency, StepRecord

GAPS_KEPT = 1024  # the swarm's last inter-token gaps
REQUESTS_KEPT = 256  # its last ended requests
AGENT_GAPS_KEPT = 16  # an agent's own last gaps: its row's ITL
STALL_SHOWN_S = 5.0  # a stall bound's note stays on screen this long (engine seconds) after the step that held it
TOKEN_STATES = ("decoding", "waiting", "prefilling", "preempted")  # between two of its tokens, an agent is in one


def percentile(values: Iterable[float], p: float) -> float | None:
    """The nearest-rank p-th percentile (0-100); None for no values."""
    xs = sorted(values)
    if not xs:
        return None
    return xs[max(0, math.ceil(p / 100 * len(xs)) - 1)]


@dataclass
class Latencies:
    gaps_s: deque = field(default_factory=lambda: deque(maxlen=GAPS_KEPT))
    requests: deque[RequestLatency] = field(default_factory=lambda: deque(maxlen=REQUESTS_KEPT))
    agent_gaps_s: dict = field(default_factory=dict)  # agent id -> deque of its last gaps
    stall_note: str = ""  # the latest "stall bound B ms: X of Y tokens", and the step's clock then
    stall_at_s: float = -math.inf
    now_s: float = 0.0
    _last: dict = field(default_factory=dict)  # agent id -> (t, generated, turns, state) at its last token

    def add(self, r: StepRecord) -> None:
        self.now_s = r.t
        self.requests.extend(r.ended)
        if r.kind == "prefill" and r.note.startswith("stall bound"):
            self.stall_note, self.stall_at_s = r.note, r.t
        last = self._last
        for a in r.agents:
            before = last.get(a.id)
            if before is not None and a.generated == before[1] and a.turns == before[2]:
                continue  # no token for it this step, its turn goes on
            # a gap: a token after one of the same turn (the turn may end at it), none before a turn's first
            if before is not None and a.generated > before[1] and before[3] in TOKEN_STATES \
                    and a.turns - before[2] in (0, 1):
                n = a.generated - before[1]
                gap = (r.t - before[0]) / n
                mine = self.agent_gaps_s.setdefault(a.id, deque(maxlen=AGENT_GAPS_KEPT))
                for _ in range(min(n, AGENT_GAPS_KEPT)):
                    self.gaps_s.append(gap)
                    mine.append(gap)
            last[a.id] = (r.t, a.generated, a.turns, a.state)

    def agent_itl_s(self, agent_id: int) -> float | None:
        """An agent's mean gap over its last few tokens; None before it has two in one turn."""
        d = self.agent_gaps_s.get(agent_id)
        return sum(d) / len(d) if d else None

    @property
    def stall(self) -> str:
        """The stall bound's latest note while it is recent, else ""."""
        return self.stall_note if self.now_s - self.stall_at_s <= STALL_SHOWN_S else ""

    def request_percentiles(self, name: str) -> tuple[float | None, float | None, float | None]:
        """p50, p95, p99 of one of the ended requests' fields (queue_s, prefill_time_s, ttft_s, itl_max_s)."""
        xs = [v for q in self.requests if (v := getattr(q, name)) is not None]
        return percentile(xs, 50), percentile(xs, 95), percentile(xs, 99)

    def gap_percentiles(self) -> tuple[float | None, float | None, float | None]:
        return percentile(self.gaps_s, 50), percentile(self.gaps_s, 95), percentile(self.gaps_s, 99)

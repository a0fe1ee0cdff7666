"""What the dashboard shows, folded from step records: rolling rates, histories, the latest state.
Pure Python (no widgets), so replay, attach and the live engine share it."""

from collections import deque
from dataclasses import dataclass, field

from swarmtune.engine.measure.energy_share import joules_by_agent
from swarmtune.engine.measure.rolling import RollingRate
from swarmtune.engine.model.bytes_model import bytes_model_from_header
from swarmtune.engine.record.records import AgentView, StepRecord
from swarmtune.tui.budget import BudgetWatch, outlook_text
from swarmtune.tui.latency import Latencies

HISTORY = 240
MISSES_KEPT = 5  # the misses panel's rows


def preview_record(h: dict) -> StepRecord | None:
    """What the screen shows before the first step, from the header alone: each agent starting at no context,
    and the settings' batch (its weight bytes from the byte model; modeled, as a step's are); None where the
    header does not say the settings."""
    s = h.get("settings") or {}
    agents, cap = int(s.get("agents") or 0), int(s.get("batch_cap") or 0)
    if not agents or not cap:
        return None
    bm = bytes_model_from_header(h)
    views = [AgentView(i, 0, "starting", int(s.get("ctx_per_agent") or 0), 0, 0, "") for i in range(agents)]
    return StepRecord(step=-1, t=0.0, kind="idle", batch=cap, batch_ids=[], batch_cap=cap, kv_type=str(s.get("kv")),
                      agents=views, weight_bytes=int(bm.weight_bytes(cap)) if bm is not None else 0, kv_bytes=0.0,
                      seconds=0.0, tokens=0, source=str(h.get("source", "")), note="starting")


@dataclass
class Stats:
    header: dict = field(default_factory=dict)
    latest: StepRecord | None = None
    latest_decode: StepRecord | None = None
    steps: int = 0
    batch_history: deque = field(default_factory=lambda: deque(maxlen=HISTORY))  # (step, batch, cap, waiting)
    measured_points: deque = field(default_factory=lambda: deque(maxlen=400))  # (mean context, speedup, batch)
    # speculation: the verify steps' measured speedups apart (they count kept drafts), each recent decode step's
    # (batch, drafted, kept) while drafts were on, and the drafted and kept tokens since the dashboard began
    spec_points: deque = field(default_factory=lambda: deque(maxlen=400))
    spec_recent: deque = field(default_factory=lambda: deque(maxlen=64))
    drafted: int = 0
    accepted: int = 0
    prefills: deque = field(default_factory=lambda: deque(maxlen=32))  # the latest prefill steps' (tokens, seconds)
    rate: RollingRate = field(default_factory=RollingRate)
    latency: Latencies = field(default_factory=Latencies)  # inter-token gaps, ended requests, the stall bound
    budget: BudgetWatch = field(default_factory=BudgetWatch)  # the resident histories' growth toward the KV budget
    agent_rate: dict = field(default_factory=dict)  # id -> deque of (t, generated)
    joules: float = 0.0
    energy_tokens: int = 0
    rebuild_note: str = ""
    tuner_on: bool = False  # the source's tuner holds the settings (the app sets it from the source's state)
    # what the tuner has spent (its last `cost` record: thinking, probes, switches, in engine seconds) and when
    tuner_spent_s: float | None = None
    tuner_spent_at_s: float = 0.0
    tuner_trying: str = ""  # the setting an experiment is trying now, if one runs
    tuner_budget: str = ""  # the tuner's last word on the KV budget binding (tui/budget.py's outlook_text)
    tuner_drafts: str = ""  # its last verdict on speculation (--draft auto): kept or off, and the gain measured
    # per KV setting: the live quality check's latest figures (its `quality` record's JSON), and the decode
    # tokens and seconds the swarm ran at it (measured): the trade of quality for speed, side by side
    quality: dict = field(default_factory=dict)
    kv_decode: dict = field(default_factory=dict)  # kv -> [tokens, seconds]
    # served agents: the latest misses, newest last (the step's clock, agent id, its conversation, the miss in
    # short), and each agent's share of the steps' energy with the tokens it generated meanwhile
    misses: deque = field(default_factory=lambda: deque(maxlen=MISSES_KEPT))
    _last_miss: dict = field(default_factory=dict)  # agent id -> the miss last listed
    agent_joules: dict = field(default_factory=dict)  # agent id -> joules since the dashboard began
    _generated_from: dict = field(default_factory=dict)  # agent id -> its generated count when first seen

    @property
    def prefill_tokens_per_s(self) -> float | None:
        """The recent prefill steps' rate (measured, or the sim's modeled): what a prompt's time left is read at."""
        seconds = sum(s for _, s in self.prefills)
        return sum(t for t, _ in self.prefills) / seconds if seconds > 0 else None

    @property
    def draft_gain(self) -> float | None:
        """The tokens a decoding agent gained a step from its kept drafts, over the recent steps while drafts were
        on (measured); None while they are off."""
        batch = sum(b for b, _, _ in self.spec_recent)
        return sum(k for _, _, k in self.spec_recent) / batch if batch else None

    def set_header(self, header: dict) -> None:
        """A run's header; before any step, every panel draws from it (preview_record) while the engine starts."""
        self.header = header
        if self.steps == 0 and header.get("preview"):  # only a source still starting its engine sends one
            self.latest = self.latest_decode = preview_record(header)

    def reset(self) -> None:
        header = self.header
        self.__init__()  # type: ignore[misc]
        self.header = header

    def add(self, r: StepRecord) -> None:
        self.latest = r
        self.steps += 1
        t = r.t
        self.rate.add(r)
        self.latency.add(r)
        self.budget.add(r)
        waiting = sum(1 for a in r.agents if a.state in ("waiting", "prefilling", "preempted"))
        at_tool = sum(1 for a in r.agents if a.state in ("tool", "client"))
        if r.kind == "decode" and not r.reference:  # a batch-1 reference step is not where the swarm is
            self.latest_decode = r
            acc = self.kv_decode.setdefault(r.kv_type, [0, 0.0])
            acc[0] += r.tokens
            acc[1] += r.seconds
            self.batch_history.append((r.step, r.batch, r.batch_cap, waiting, at_tool))
            if r.measured_speedup is not None:
                points = self.spec_points if r.drafted else self.measured_points
                points.append((r.mean_context, r.measured_speedup, r.batch))
            if r.draft_setting != "0":
                self.spec_recent.append((r.batch, r.drafted, r.accepted))
            self.drafted += r.drafted
            self.accepted += r.accepted
        if r.kind == "decode" and r.joules is not None:  # every decode's energy, reference steps' too
            self.joules += r.joules
            self.energy_tokens += r.tokens
        if r.kind == "prefill" and r.seconds > 0:
            self.prefills.append((r.tokens, r.seconds))
        if r.kind == "rebuild":
            self.rebuild_note = r.note
        if r.kind == "tune" and r.tune is not None:
            self._tune(r)
        for a in r.agents:
            d = self.agent_rate.setdefault(a.id, deque(maxlen=64))
            d.append((t, a.generated))
            self._generated_from.setdefault(a.id, a.generated)
            if a.miss and a.miss != self._last_miss.get(a.id):
                self.misses.append((t, a.id, a.label, a.miss))
            self._last_miss[a.id] = a.miss
        for aid, joules in joules_by_agent(r).items():
            self.agent_joules[aid] = self.agent_joules.get(aid, 0.0) + joules

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
        elif d.get("phase") == "budget":
            self.tuner_budget = outlook_text(d)
        elif d.get("phase") == "speculation":
            gain = "" if d.get("gain") is None else f" {d['gain']:+.1%} (95% {d['low']:+.1%}..{d['high']:+.1%})"
            self.tuner_drafts = f"drafts {'kept' if d['result'] == 'kept' else 'off'}{gain}" \
                if d["result"] != "abandoned" else ""
        elif d.get("phase") == "quality" and d.get("mean_kl") is not None:
            self.quality[d["kv"]] = d

    def kv_tokens_per_second(self, kv: str) -> float | None:
        """Decode tokens per second of decode time at a KV setting over the run (measured; its contexts were
        those of when it ran)."""
        tokens, seconds = self.kv_decode.get(kv, (0, 0.0))
        return tokens / seconds if seconds > 0 else None

    def quality_text(self, live: str) -> str:
        """The live setting's measured quality, then the others', each with its speed against the live one
        where both ran: "q8_0 KL 0.0044 (p99 0.021) top-1 96% | f16/q8_0 KL 0.0041 ... +3% tok/s"."""
        parts = []
        here = self.kv_tokens_per_second(live)
        for kv in sorted(self.quality, key=lambda k: (k != live, k)):
            d = self.quality[kv]
            s = f"{kv} KL {d['mean_kl']:.4f} (p99 {d['p99_kl']:.3f}) top-1 {d['top1_same']:.0%}"
            there = self.kv_tokens_per_second(kv)
            if kv != live and here and there:
                s += f" {there / here - 1:+.0%} tok/s"
            parts.append(s)
        return " | ".join(parts)

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

    def agent_joules_per_token(self, agent_id: int, generated: int) -> float | None:
        """An agent's share of the steps' energy (engine/measure/energy_share.py) over the tokens it generated since
        the dashboard began: None before either is known."""
        tokens = generated - self._generated_from.get(agent_id, generated)
        joules = self.agent_joules.get(agent_id)
        return joules / tokens if joules and tokens > 0 else None

    @property
    def joules_per_token(self) -> float | None:
        return self.joules / self.energy_tokens if self.energy_tokens and self.joules > 0 else None

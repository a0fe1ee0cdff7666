"""The live KV quality check: what the swarm's own KV settings do to its agents' next-token distributions,
measured on their own histories while the swarm runs, and the ledger of what it measured.

Now and then (its seconds held to `budget_share` of the run's, measured: the check runs on the engine's
thread, between steps, and starts only where what it is expected to cost, at the rate the last one measured
or the engine's own prefill rate, keeps the share within budget after it) the check measures one agent: the
one it measured last while its history grows, else the longest history whose check fits the budget now.
- When the swarm runs quantized, the backend keeps the logits the live cache produced at that agent's next
  CHECK_POSITIONS decode positions (LlamaBackend.keep_logits), and the agent's history up to them is
  teacher-forced through one side context of the same model at the f16/f16 reference.
- When it runs f16, the check measures the next setting the tuner may move to that has no figure at these
  contexts: the agent's last CHECK_POSITIONS positions through two side contexts, the reference and the
  setting. The live f16 rows cannot stand for the reference: llama.cpp's CPU flash attention computes a
  one-row decode over an f16 cache with its query rounded to f16 and a prefill's rows in f32 tiles, and the
  two differ by ~0.003 nats on the default model (as much as q8_0 costs; tests/test_quality_check.py
  measures it), while over a quantized cache a decode row and a prefill row come out the same, bit for bit.
The two sides are compared per position (engine/quality/kv_quality.py: KL of the test's next-token distribution from
the reference's, top token kept). Figures gather per setting and context band (an octave of context:
512-1023 tokens, ...): a band's figure stands for the contexts in it and says nothing of longer ones, so a
setting's figure goes stale as the swarm's contexts grow out of its band.

A side context prefills the agent's history: that is the check's cost (one prefill when the swarm runs
quantized, two when it runs f16; the live side costs a copy of a row per position), which is why it is
sampled and budgeted, and why it is off on the simulated card (no logits there: its quality is not
measured, and says so). The side contexts are held between checks of one agent, so a check of its grown
history computes only what is new: the first check of an agent is the dear one, and comes as soon as the
budget covers it, on a short history, which the next checks follow as it grows.
"""

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from swarmtune.engine.agents.agent import Agent
from swarmtune.engine.engine_view import EngineView
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.quality.kv_quality import MIN_POSITIONS, REFERENCE, BandFigures, kl_and_top1
from swarmtune.engine.record.records import StepRecord
from swarmtune.engine.tune.events import QualityChecked, TuneEvent

if TYPE_CHECKING:
    from swarmtune.engine.backends.llama_backend import KeptLogits, LlamaBackend

CHECK_POSITIONS = 64  # positions compared per check: two checks of one band reach MIN_POSITIONS
MIN_HISTORY = 2 * CHECK_POSITIONS  # an agent with less history is not checked (too little context to mean much)
BUDGET_SHARE = 0.02  # the check's seconds, at most this share of the run's (the bar: under 3%)
FIRST_AFTER_S = 5.0  # no check in the run's first seconds: its histories are still being prefilled
WATCH_S = 120.0  # a watched agent that has not decoded CHECK_POSITIONS tokens in this long is let go
DEFAULT_KV_QUALITY = 0.01  # nats: the tuner's default budget of mean KL (docs/quality.md: chosen from measurement)
# what the tuner may choose from under a quality budget where --tune-kv does not narrow it: the types and
# K/V pairs worth their bytes (q4_0 K is the one users report breaking agents; it is here so the budget,
# measured, is what keeps it out)
QUALITY_CANDIDATES = tuple(KVSetting.parse(t) for t in ("f16", "q8_0", "f16/q8_0", "q8_0/f16", "q8_0/q4_0", "q4_0"))


def band_of(context: float) -> tuple[int, int]:
    """The octave of context a history of this length falls in: [2^k, 2^(k+1))."""
    lo = 2 ** int(math.floor(math.log2(max(context, 2.0))))
    return lo, 2 * lo


@dataclass
class QualityLedger:
    """Every figure the checks measured, per (setting, band). The reference (f16/f16) is its own: KL 0."""

    figures: dict[tuple[KVSetting, tuple[int, int]], BandFigures] = field(default_factory=dict)

    def add(self, setting: KVSetting, band: tuple[int, int], kl: np.ndarray, same: np.ndarray) -> BandFigures:
        f = self.figures.setdefault((setting, band), BandFigures(setting, band))
        f.add(kl, same)
        f.close()
        return f

    def figure(self, setting: KVSetting, context: float) -> BandFigures | None:
        """The figure that stands for a setting at this context (its band's), if one was measured."""
        return self.figures.get((setting, band_of(context)))

    def mean_kl(self, setting: KVSetting, context: float) -> float | None:
        """Mean KL at this context (0 for the reference itself); None where not measured (or too few positions)."""
        if setting == REFERENCE:
            return 0.0
        f = self.figure(setting, context)
        return None if f is None else f.mean_kl

    def within(self, setting: KVSetting, context: float, budget_kl: float) -> bool | None:
        """Whether a setting's measured KL at this context is within a budget; None: not measured here."""
        kl = self.mean_kl(setting, context)
        return None if kl is None else kl <= budget_kl

    def rows(self) -> list[dict[str, Any]]:
        return [f.to_json() for f in self.figures.values()]


@dataclass
class _Watch:
    """An agent whose decode logits the backend keeps for the next check."""

    agent_id: int
    seq: int
    live: KVSetting  # the live setting when the watch began, the one measured: rows of any other are not used
    since_s: float


class QualityCheck:
    """The live check (engine hook): sees every record, now and then measures one setting on one agent."""

    def __init__(self, budget_share: float = BUDGET_SHARE, wanted: tuple[KVSetting, ...] = ()) -> None:
        self.ledger = QualityLedger()
        self.budget_share = budget_share
        self.wanted = wanted  # settings to measure while the swarm runs f16
        self.spent_s = 0.0  # wall seconds of checks (measured)
        self.checks = 0
        self._next = 0  # which wanted setting is next
        # what a check costs per token a side context teacher-forces: from the last check, or before any,
        # from the engine's own prefill chunks (tokens, seconds), measured
        self._check_s_per_token: float | None = None
        self._prefill = [0, 0.0]
        self._watch: _Watch | None = None
        self._sides = _SideContexts()

    def enabled(self, engine: EngineView) -> bool:
        return hasattr(engine.backend, "new_scorer") and engine.backend.source != "simulated"

    def expected_s(self, tokens: int) -> float | None:
        """What a check that teacher-forces this many tokens (over its side contexts, those they hold not
        counted) is expected to cost: at the rate the last check measured, or, before any, at the engine's
        own prefill rate; None before either is known."""
        if self._check_s_per_token is not None:
            return self._check_s_per_token * tokens
        done, seconds = self._prefill
        return tokens * seconds / done if done >= 256 and seconds > 0 else None

    def due(self, engine: EngineView, tokens: int) -> bool:
        """A check fits: what it is expected to cost, on top of what the checks spent, within budget_share of
        the run so far (so the share holds after it, not only before)."""
        now = engine.now_s()
        cost = self.expected_s(tokens)
        return now >= FIRST_AFTER_S and cost is not None and self.spent_s + cost <= self.budget_share * now

    def close(self) -> None:
        self._sides.close()

    def observe(self, engine: EngineView, rec: StepRecord) -> list[TuneEvent]:
        if rec.kind == "prefill" and rec.seconds > 0:
            self._prefill[0] += rec.tokens
            self._prefill[1] += rec.seconds
        if rec.kind in ("tune", "rebuild") or not self.enabled(engine):
            return []
        if self._watch is not None:
            return self._follow_watch(engine)
        live = engine.s.kv
        setting = live if live != REFERENCE else self._candidate_to_check(engine)
        if setting is None:
            return []
        agent = self._agent_to_check(engine, setting, live)
        if agent is None:
            return []
        if live == REFERENCE:  # two side contexts, now
            return [self.check(_llama(engine), setting, list(agent.history), agent_id=agent.id, n_ctx=agent.limit)]
        # one side context, once the live cache has produced the positions to compare
        self._watch = _Watch(agent.id, agent.seq, live, engine.now_s())
        _llama(engine).keep_logits(agent.seq, CHECK_POSITIONS)
        return []

    def _cost_tokens(self, agent: Agent, setting: KVSetting, live: KVSetting) -> int:
        """Tokens a check of this agent would compute: what its side contexts do not hold yet (the reference,
        up to the positions still to be decoded, while the swarm runs quantized; both while it runs f16)."""
        n = len(agent.history)
        if live != REFERENCE:
            return n + CHECK_POSITIONS - self._sides.reusable(REFERENCE, agent.history, agent.id)
        return sum(n - self._sides.reusable(x, agent.history, agent.id) for x in (REFERENCE, setting))

    def _agent_to_check(self, engine: EngineView, setting: KVSetting, live: KVSetting) -> Agent | None:
        """The agent the side contexts hold, while its history still extends what they hold (a check of it
        computes only its new tokens); else the longest history whose check fits the budget now, so that a
        first check comes early, on a short history, and the next ones follow it as it grows."""
        # while quantized, the agent must decode CHECK_POSITIONS more tokens before its context is full (and
        # its task starts again): room for them and some of the tool results between its turns
        room = 0 if live == REFERENCE else 2 * CHECK_POSITIONS
        eligible = sorted((a for a in engine.agents if len(a.history) >= MIN_HISTORY
                           and a.limit - len(a.history) >= room), key=lambda a: -len(a.history))
        held = [a for a in eligible if a.id == self._sides.agent_id
                and self._sides.reusable(REFERENCE, a.history) >= MIN_HISTORY]
        for a in held + [a for a in eligible if a not in held]:
            if self.due(engine, self._cost_tokens(a, setting, live)):
                return a
        return None

    def _stop_watch(self, engine: EngineView) -> None:
        self._watch = None
        _llama(engine).keep_logits(None)

    def _follow_watch(self, engine: EngineView) -> list[TuneEvent]:
        w = self._watch
        assert w is not None
        agent = next((a for a in engine.agents if a.id == w.agent_id), None)
        if (agent is None or agent.seq != w.seq or engine.s.kv != w.live
                or engine.now_s() - w.since_s > WATCH_S):
            self._stop_watch(engine)  # the agent left the cache, the live setting moved, or it went quiet
            return []
        history = agent.history
        kept = [k for k in _llama(engine).watch.kept if k.kv == w.live]
        if any(k.pos >= len(history) or history[k.pos] != k.token for k in kept):
            self._stop_watch(engine)  # its history was replaced (a new task, a full context): start again
            return []
        if len(kept) < CHECK_POSITIONS:
            return []
        self._stop_watch(engine)
        return [self.check(_llama(engine), w.live, list(history), agent_id=agent.id, kept=kept, n_ctx=agent.limit)]

    def _candidate_to_check(self, engine: EngineView) -> KVSetting | None:
        """While the swarm runs f16: the next wanted setting short of a figure at the swarm's longest context."""
        context = max((len(a.history) for a in engine.agents), default=0)
        todo = [w for w in self.wanted if w != REFERENCE and self.ledger.mean_kl(w, context) is None]
        if not todo:
            return None
        return todo[self._next % len(todo)]

    def check(self, backend: "LlamaBackend", setting: KVSetting, history: list[int], agent_id: int = -1,
              kept: "list[KeptLogits] | None" = None, n_ctx: int = 0) -> QualityChecked:
        """Measure one setting on one history's last positions against f16/f16.

        With `kept` (LlamaBackend.KeptLogits of the live cache, quantized, at some of the history's
        positions): one side context at the reference teacher-forces the history up to them. Without: two
        side contexts, the reference and the setting, both teacher-force its last CHECK_POSITIONS. An agent's
        side contexts (agent_id >= 0) are held for its next check, of n_ctx cells (its context's limit)."""
        t0 = time.perf_counter()
        n = len(history)
        computed = 0
        if kept:
            at = sorted(k.pos for k in kept)
            rows = {k.pos: k.logits for k in kept}
            live_rows = np.stack([rows[p] for p in at])
            live = kept[0].kv
            if live != setting or live == REFERENCE:
                raise ValueError(f"kept rows of a {live} cache cannot measure {setting} (the live setting, "
                                 f"quantized, is measured on its own rows)")
            with self._sides.scorer(backend, REFERENCE, agent_id, max(n_ctx, at[-1] + 1)) as sc:
                ref = sc.logits(history[:at[-1] + 1], at[0], at=at)
                computed += sc.computed
            test = live_rows
            context = at[-1] + 1
            how = f"the live {live} cache's own logits against a side {REFERENCE}/{REFERENCE} context"
        else:
            first = n - CHECK_POSITIONS - 1  # the last position predicts a token not yet in the history
            with self._sides.scorer(backend, REFERENCE, agent_id, max(n_ctx, n)) as ref_sc:
                ref = ref_sc.logits(history, first)[:-1]
                computed += ref_sc.computed
            with self._sides.scorer(backend, setting, agent_id, max(n_ctx, n)) as sc:
                test = sc.logits(history, first)[:-1]
                computed += sc.computed
            self._next += 1
            context = n
            how = f"two side contexts, {setting} and {REFERENCE}/{REFERENCE}"
        kl, same = kl_and_top1(ref, test)
        band = band_of(context)
        f = self.ledger.add(setting, band, kl, same)
        wall = time.perf_counter() - t0
        self.spent_s += wall
        self._check_s_per_token = wall / max(computed, 1)
        self.checks += 1
        what = (f.line() if f.mean_kl is not None else
                f"{setting}: {f.positions} positions at contexts {band[0]}-{band[1]} so far "
                f"(a figure needs {MIN_POSITIONS})")
        return QualityChecked(
            kv=setting, band=list(band), positions=f.positions, mean_kl=_r(f.mean_kl), p99_kl=_r(f.p99_kl),
            top1_same=_r(f.top1_same), check_kl=round(float(kl.mean()), 6), agent=agent_id, context=context,
            check_s=round(wall, 3), spent_s=round(self.spent_s, 3),
            why=f"quality check: agent {agent_id}'s {len(kl)} positions up to context {context}, {setting} "
                f"against {REFERENCE}/{REFERENCE}: {how} ({wall:.2f} s, {computed} tokens computed); {what}")


def _llama(engine: EngineView) -> "LlamaBackend":
    """The engine's backend, which is llama.cpp's wherever the check runs (enabled() says so): it has side
    contexts to score in and keeps the live cache's logits."""
    return cast("LlamaBackend", engine.backend)


class _SideContexts:
    """Side contexts held between checks, for one agent at a time: a check of its grown history computes
    only the tokens they do not hold yet (Scorer.reusable), a few hundred where the first computed them all."""

    def __init__(self) -> None:
        self.agent_id: int | None = None
        self._scorers: dict[KVSetting, Any] = {}

    def reusable(self, setting: KVSetting, history: list[int], agent_id: int | None = None) -> int:
        if agent_id is not None and agent_id != self.agent_id:
            return 0
        sc = self._scorers.get(setting)
        return 0 if sc is None else sc.reusable(history, len(history))

    @contextmanager
    def scorer(self, backend: "LlamaBackend", setting: KVSetting, agent_id: int, n_ctx: int) -> Iterator[Any]:
        if agent_id < 0:  # a one-off: nothing to hold it for
            with backend.new_scorer(setting, n_ctx) as one:
                yield one
            return
        if agent_id != self.agent_id:
            self.close()
            self.agent_id = agent_id
        sc = self._scorers.get(setting)
        if sc is None or sc.n_ctx < n_ctx:
            if sc is not None:
                sc.close()
            sc = self._scorers[setting] = backend.new_scorer(setting, n_ctx)
        yield sc

    def close(self) -> None:
        for sc in self._scorers.values():
            sc.close()
        self._scorers.clear()
        self.agent_id = None


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 6)

"""A setting tried on the live swarm against the one it would replace, in interleaved blocks.

Two things are measured in every block. The objective itself (tokens/s, J/token, the floor's), which is
what counts but is noisy over a few seconds of a swarm whose agents come and go from their tools; and each
step's time against what the tuner's model (frozen at the experiment's start) says that very step costs,
for the batch and contexts it served, decode and prefill apart. The second is nearly free of the swarm's
noise: its paired difference between B's blocks and A's is how far the model mis-states B *relative to A*
on this machine, now. The tuner scales B's model by it and forecasts again (engine/tune/tuner.py), so that
what no few seconds can show (how the KV budget fills, what a preemption costs) is still counted, on step
times this run measured. The objective's own pairs guard the result: a candidate they show below its bar
at 95% is not kept, whatever the model says.

A forecast only proposes: whether a setting is kept is measured. The incumbent (A) and the candidate (B)
take turns in blocks of at least `block_s` seconds of the engine's clock, in the order A B B A A B B A ...
Each two consecutive blocks are a pair, and each pair gives one paired difference, the log of B's
objective over A's in those two blocks. Pairs cancel what drifts slowly (the contexts grow, the machine's
clock speeds up or slows down): a drift that favours the later block of a pair favours B in (A, B) and A in
(B, A), and the order alternates. Switching costs fall on both sides alike: the block after a switch
starts once the switch is done (its seconds go to the tuner's cost, not to either side), and its first
step of each kind, which also builds that graph on a real backend, is not counted.

Every figure's error comes from the pairs' own spread (the run's noise, measured, nothing assumed): with
n >= 3 pairs, mean m and standard error se, its one-sided 95% bounds are m -/+ t*se (Student's t for n - 1
degrees of freedom). The tuner keeps the candidate where even the unfavourable bound clears the bar,
rejects it where even the favourable one falls short, and otherwise runs another pair, up to `max_pairs`:
then it gives up, without a verdict, back at the incumbent.

Before the third pair the spread of the pairs cannot be known, but the run's noise can: the incumbent's
own steps before the experiment, cut into blocks of the same length, differ from block to block by what
a pair would differ by if the candidate changed nothing (`Noise`). On one or two pairs the bounds take
that spread (Student's t for its own degrees of freedom), and they may only reject: a candidate much
worse than its forecast (a KV type this CPU reads slowly) costs one pair instead of three. Keeping
always waits for the pairs' own spread.
"""

import math
import statistics
from dataclasses import dataclass, field
from typing import Protocol

from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.record.records import StepRecord
from swarmtune.engine.tune.goal import Goal, Setting
from swarmtune.engine.tune.simulator import attention_factor
from swarmtune.engine.tune.tally import Tally

MIN_PAIRS = 3  # a verdict needs the spread of at least this many pairs
# one-sided 95% quantiles of Student's t, by degrees of freedom (1..): a verdict on n pairs uses n - 1
_T95 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771, 1.761, 1.753)
CONFIDENCE = 0.95
MIN_BLOCK_DECODE_STEPS = 6  # a block's objective over fewer decode steps is mostly its first step's luck
ORDER = "ABBA"  # the blocks' pattern, repeated: each pair (AB, BA) is two consecutive blocks


def t95(df: int) -> float:
    return _T95[min(max(df, 1), len(_T95)) - 1]


class StepModel(Protocol):
    """What the tuner's model says a step costs (engine/tune/simulator.py's SimStepCost)."""

    def decode_seconds(self, batch: int, contexts: list[float], kv: KVSetting) -> float: ...

    def prefill_seconds(self, tokens: int, pos0: int, kv: KVSetting) -> float: ...

    def decode_base_seconds(self, batch: int, kv: KVSetting) -> float: ...


@dataclass
class Block:
    which: str  # "A" (the incumbent) or "B" (the candidate)
    tally: Tally = field(default_factory=Tally)
    decode_steps: int = 0
    after_switch: bool = False  # the setting changed as it began: its steps' first graphs are built anew
    warm: set[tuple[str, int]] = field(default_factory=set)  # (kind, batch) seen since the switch
    # per kind of step ("decode", "prefill"): [measured seconds, modeled seconds, of them not growing with
    # the contexts]
    timed: dict[str, list[float]] = field(default_factory=dict)

    def residual(self, kind: str) -> float | None:
        """log(measured / modeled) over the block's steps of a kind (time-weighted); None without any."""
        m = self.timed.get(kind)
        return None if not m or m[0] <= 0 or m[1] <= 0 else math.log(m[0] / m[1])


@dataclass
class Noise:
    """How much consecutive blocks of the incumbent differed before the experiment, per measure (the
    objective's log, and each kind of step's residual against the model): the standard deviation of their
    log differences and over how many differences (measured). What one pair would differ by where the
    candidate changed nothing."""

    sd: dict[str, tuple[float, int]]


MIN_NOISE_DIFFS = 3  # a noise from fewer block differences is not used: t for 1 df is 6.3
# the least spread a block difference is taken to have: a swarm whose blocks happened to agree (a simulated
# card has no jitter) does not make one pair a proof
NOISE_FLOOR = 0.01


@dataclass
class Result:
    """What an experiment measured: the candidate's gain over the incumbent (a relative change of the
    objective, positive is better) with its one-sided 95% bounds, over how many pairs."""

    pairs: int
    gain: float | None  # exp(mean log ratio) - 1
    low: float | None  # the bounds at one-sided 95%, from the pairs' spread (measured)
    high: float | None
    spread: float | None  # the pairs' standard deviation of log ratios


@dataclass
class Experiment:
    incumbent: Setting
    candidate: Setting
    goal: Goal
    n_agents: int
    block_s: float  # each block at least this long (engine clock)
    max_pairs: int
    bar: float  # the gain it must clear (log): what going over costs, over what is left of the run
    forecast_gain: float | None  # the proposal's forecast (modeled)
    forecast_error: float  # the forecast's own error as stated (modeled or measured)
    exploratory: bool  # proposed within the forecast's error: an experiment, accounted as one
    model: StepModel | None = None  # the tuner's step model, frozen at the start
    blocks: list[Block] = field(default_factory=list)
    diffs: list[float] = field(default_factory=list)  # per pair: log(B / A) of the objective
    # per pair and kind of step: B's residual against the model less A's (log), where both blocks had one
    step_diffs: dict[str, list[float]] = field(default_factory=dict)
    switch_s: float = 0.0  # seconds its switches took
    switch_cells: int = 0  # cells they converted or prefilled again
    # the candidate's gain (log) forecast again on its measured step times: (unfavourable, central,
    # favourable), as far as the last verdict computed them
    corrected: tuple[float | None, float | None, float | None] | None = None
    noise: Noise | None = None  # the incumbent's block-to-block noise before it began (measured), if known

    def __post_init__(self) -> None:
        self.blocks.append(Block("A"))  # the incumbent, as it runs: no switch before it

    @property
    def current(self) -> Block:
        return self.blocks[-1]

    def setting_for(self, which: str) -> Setting:
        return self.incumbent if which == "A" else self.candidate

    def add(self, r: StepRecord, live: Setting) -> str | None:
        """A step of the swarm. Returns the block that should run next ("A" or "B") when the current one has
        just closed, else None. Steps of a setting other than the block's (a switch still being applied)
        and the switch's own records are not counted."""
        b = self.current
        if r.kind in ("tune", "rebuild") or live != self.setting_for(b.which):
            return None
        if b.after_switch and r.kind in ("decode", "prefill"):
            # after a switch (a KV switch opens a new context) the first step of each kind and batch size also
            # builds that graph: the switch's cost, not the setting's
            key = (r.kind, r.batch)
            if key not in b.warm:
                b.warm.add(key)
                return None
        b.tally.add(r)
        if r.kind == "decode":
            b.decode_steps += 1
        self._time(b, r)
        if b.decode_steps < MIN_BLOCK_DECODE_STEPS or b.tally.seconds < self.block_s:
            return None
        self._close()
        nxt = ORDER[len(self.blocks) % len(ORDER)]
        self.blocks.append(Block(nxt, after_switch=nxt != b.which))
        return nxt

    def _time(self, b: Block, r: StepRecord) -> None:
        if self.model is None or r.seconds <= 0:
            return
        modeled, base = 0.0, 0.0
        if r.kind == "decode" and r.batch:
            ctx = {a.id: a.context for a in r.agents}
            contexts = [float(ctx.get(i, r.mean_context)) for i in r.batch_ids]
            modeled = self.model.decode_seconds(r.batch, contexts, r.kv)
            base = min(self.model.decode_base_seconds(r.batch, r.kv), modeled)
        elif r.kind == "prefill" and r.tokens and r.batch_ids:
            after = next((a.context for a in r.agents if a.id == r.batch_ids[0]), r.tokens)
            modeled = self.model.prefill_seconds(r.tokens, max(after - r.tokens, 0), r.kv)
        if modeled > 0:
            m = b.timed.setdefault(r.kind, [0.0, 0.0, 0.0])
            m[0] += r.seconds
            m[1] += modeled
            m[2] += base

    def _close(self) -> None:
        if len(self.blocks) % 2 == 1:
            return  # the first block of a pair
        first, second = self.blocks[-2], self.blocks[-1]
        a, b = (first, second) if first.which == "A" else (second, first)
        sa, sb = a.tally.score(self.goal, self.n_agents), b.tally.score(self.goal, self.n_agents)
        self.diffs.append(_log_ratio(sb, sa))
        for kind in ("decode", "prefill"):
            ra, rb = a.residual(kind), b.residual(kind)
            if ra is None or rb is None:
                continue
            d = rb - ra
            self.step_diffs.setdefault(kind, []).append(d)
            if kind == "decode" and self.candidate.kv != self.incumbent.kv:
                # a KV type differs in how it reads its cells: the pair's difference as a factor on attention
                # alone (what grows with the contexts, so that it holds as they grow), where attention is a
                # share of B's modeled steps large enough to tell; a pair where it is not says nothing of it
                m = b.timed["decode"]
                f = attention_factor(math.exp(d), m[2] / m[1])
                if f is not None:
                    self.step_diffs.setdefault("attention", []).append(math.log(f))

    def step_factor(self, kind: str) -> tuple[float, float, float] | None:
        """B's step times over what the model said, relative to A's (a factor): "decode" on the whole step,
        "attention" on what grows with the contexts alone (a KV experiment), "prefill": central, and its
        one-sided 95% bounds (low, high), from the pairs' spread; None with fewer than MIN_PAIRS pairs."""
        d = self.step_diffs.get(kind, [])
        if len(d) < MIN_PAIRS:
            return None
        m = statistics.fmean(d)
        half = t95(len(d) - 1) * statistics.stdev(d) / math.sqrt(len(d))
        return math.exp(m), math.exp(m - half), math.exp(m + half)

    def early_step_factor(self, kind: str) -> tuple[float, float, float] | None:
        """As step_factor on one or two pairs, its bounds from the incumbent's noise before the experiment
        (or the pairs' own spread where that is wider); None without that noise. Only a rejection may rest
        on it."""
        d = self.step_diffs.get(kind, [])
        half = self._early_half(kind, d)
        if not d or half is None:
            return None
        m = statistics.fmean(d)
        return math.exp(m), math.exp(m - half), math.exp(m + half)

    def early_result(self) -> Result | None:
        """As result() on one or two pairs, its bounds from the incumbent's noise; None without it."""
        half = self._early_half("objective", self.diffs)
        if not self.diffs or half is None:
            return None
        m = statistics.fmean(self.diffs)
        return Result(len(self.diffs), math.expm1(m), math.expm1(m - half), math.expm1(m + half),
                      self.noise.sd["objective"][0] if self.noise else None)

    def _early_half(self, measure: str, d: list[float]) -> float | None:
        if self.noise is None or measure not in self.noise.sd or not d:
            return None
        sd, n = self.noise.sd[measure]
        sd = max(sd, NOISE_FLOOR)
        if len(d) >= 2:
            sd = max(sd, statistics.stdev(d))
        return t95(n - 1) * sd / math.sqrt(len(d))

    def measure_noise(self, records: list[StepRecord]) -> Noise | None:
        """The incumbent's noise from its steps before the experiment (all at the incumbent's setting, oldest
        first): cut into blocks as an experiment's, the log differences of consecutive blocks' objective and
        residuals. None from fewer than MIN_NOISE_DIFFS differences."""
        blocks: list[Block] = [Block("A")]
        for r in records:
            b = blocks[-1]
            if r.kind in ("tune", "rebuild"):
                continue
            b.tally.add(r)
            b.decode_steps += r.kind == "decode"
            self._time(b, r)
            if b.decode_steps >= MIN_BLOCK_DECODE_STEPS and b.tally.seconds >= self.block_s:
                blocks.append(Block("A"))
        closed = blocks[:-1]
        if len(closed) < MIN_NOISE_DIFFS + 1:
            return None
        scores = [b.tally.score(self.goal, self.n_agents) for b in closed]
        objective = [_log_ratio(y, x) for x, y in zip(scores, scores[1:], strict=False)]
        sd = {"objective": (statistics.stdev(objective), len(objective))}
        for kind in ("decode", "prefill"):
            res = [b.residual(kind) for b in closed]
            d = [y - x for x, y in zip(res, res[1:], strict=False) if x is not None and y is not None]
            if len(d) >= MIN_NOISE_DIFFS:
                sd[kind] = (statistics.stdev(d), len(d))
        self.noise = Noise(sd=sd)
        return self.noise

    def result(self) -> Result:
        n = len(self.diffs)
        if n == 0:
            return Result(0, None, None, None, None)
        m = statistics.fmean(self.diffs)
        if n < 2:
            return Result(n, math.expm1(m), None, None, None)
        sd = statistics.stdev(self.diffs)
        half = t95(n - 1) * sd / math.sqrt(n)
        return Result(n, math.expm1(m), math.expm1(m - half), math.expm1(m + half), sd)

    def switches_made(self) -> int:
        """Block boundaries where the setting changed (ABBA: every second one); the way back at its end, if
        any, is the tuner's switch, counted in its cost."""
        return sum(a.which != b.which for a, b in zip(self.blocks, self.blocks[1:], strict=False))

    def seconds_on(self, which: str) -> float:
        return sum(b.tally.seconds for b in self.blocks if b.which == which)

    def tokens_lost(self) -> float:
        """What running the candidate cost against the incumbent's rate over the same time (negative: it
        gained), measured over the closed blocks: the experiment's own throughput cost."""
        a = [b for b in self.blocks if b.which == "A" and b.tally.seconds > 0]
        b = [x for x in self.blocks if x.which == "B" and x.tally.seconds > 0]
        if not a or not b:
            return 0.0
        rate_a = sum(x.tally.tokens for x in a) / sum(x.tally.seconds for x in a)
        return sum(rate_a * x.tally.seconds - x.tally.tokens for x in b)


def _log_ratio(new: float, old: float) -> float:
    """log(new / old) of two scores; a score at or below zero (over a cap, under a floor) as a relative change
    from there, clipped so that one such block cannot swamp the rest."""
    if new > 0 and old > 0:
        return math.log(new / old)
    if old != 0:
        return math.log1p(max(min((new - old) / abs(old), 1.0), -0.9))
    return 0.0

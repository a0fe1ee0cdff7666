"""Speculation as the tuner's move (--draft auto under --autotune): whether drafts ride is decided as its
other moves are, on interleaved pairs of blocks measured on the swarm, and kept only where the pairs say
at 95% that drafts gain more than the bar. Which agents draft, and how many tokens, stays the measured
rule's (engine/spec/draft_policy.py: each agent's share kept, a verified row's and drafting's seconds at the
live batch), so a kept verdict is the rule's lengths, and an off one is no drafts.

A block is BLOCK_STEPS decode steps of the swarm (a batch-1 reference step apart), its figure their tokens
over their seconds (drafting's seconds, a draft model's, included; under the tuner's joules_per_token, over
their joules, where every step was metered): drafts move decode steps only, and
leaving prefill out keeps a block's noise the decode's. The pairs alternate which side goes first, so a
trend (contexts growing) falls on both. An experiment runs only while no other does (the tuner's looks
wait for it, and it for them), and the next one comes after RETRY_STEPS decode steps, twice as many each
time drafts were turned off (contexts grow, and with them what a shared KV read saves), up to RETRY_MAX.
Its cost is the tuner's: its blocks' seconds, its switches, and the tokens the candidate's blocks made
fewer than the incumbent's rate would have (engine/tune/cost.py). A length a person sets (0 included) ends
its say; a block cut by the run's end leaves the side that was in force before it."""

import math
import statistics
from dataclasses import dataclass

from swarmtune.engine.control import Control
from swarmtune.engine.engine_view import EngineView
from swarmtune.engine.errors import UserError
from swarmtune.engine.record.records import StepRecord
from swarmtune.engine.settings import DraftSetting
from swarmtune.engine.tune.cost import Spending
from swarmtune.engine.tune.events import Speculated, TuneEvent
from swarmtune.engine.tune.experiment import t95

BLOCK_STEPS = 16
MIN_PAIRS, MAX_PAIRS = 3, 8
BAR = 0.01  # drafts kept only where they gain more than 1% at 95%, as the tuner's other moves
RETRY_STEPS, RETRY_MAX = 256, 4096


@dataclass
class _Block:
    drafts: bool
    steps: int = 0
    tokens: int = 0
    seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0
    joules: float = 0.0  # where every step of it was metered
    metered: bool = True


class DraftTrial:
    """Owns speculation under the tuner: whether it owns it, the experiment under way, when the next one is due."""

    def __init__(self, cost: Spending) -> None:
        self.cost = cost
        self.auto: DraftSetting | None = None  # the user's --draft auto: the tuner's to decide (None: not)
        self.expected: DraftSetting | None = None  # the live setting as the tuner last left it
        self.on = True  # drafts ride outside experiments (the user's auto, until measured otherwise)
        # what a block's figure is: decode tokens/s, or, under the tuner's joules_per_token, decode tokens per
        # joule (a verified row costs a draft's energy as well as its seconds)
        self.objective = "tokens_per_s"
        self._incumbent = True  # the side in force when the experiment under way began
        self.restart()

    def restart(self) -> None:
        """The tuner on (again): no experiment under way, the next at once. Whose the draft length is, and
        the last verdict, are kept: a tuner turned off mid-block gives auto back at its next record."""
        self.blocks: list[_Block] = []
        self.wait_steps = 0  # the first experiment at once: the rule's lengths have not been measured against none
        self.since = 0  # decode steps since the last experiment ended
        self.retry = RETRY_STEPS

    @property
    def running(self) -> bool:
        return bool(self.blocks)

    def observe(self, engine: EngineView, rec: StepRecord, free: bool, run_s: float | None) -> list[TuneEvent]:
        """A record: taken into the block under way, or counted toward the next experiment (free: no other
        experiment under way, so one may start; run_s: the run's end, where known)."""
        live = engine.state().draft or DraftSetting(engine.s.draft_tokens, engine.s.draft_auto)
        if self.auto is None:
            if not (live.auto and live.tokens):
                return []
            self.auto = self.expected = live  # owned from here: a person's later change of it ends that
        if live != self.expected:  # a person set the length (0 included): theirs from now on
            out = self._end(engine, "abandoned") if self.running else []
            self.auto = self.expected = None
            return out
        if not self.running and self.on != bool(live.tokens):  # its verdict, where a restart left a block's
            self._set(engine, self.on)
        if rec.kind != "decode" or rec.reference or not rec.batch or rec.prefill_tokens:
            return []  # a chunk riding the step (--mix) is prefill's seconds, not the drafts'
        if not self.running:
            self.since += 1
            if free and self.since >= self.wait_steps:
                self.blocks = [_Block(drafts=self.on)]  # the incumbent first
                self._incumbent = self.on
            return []
        b = self.blocks[-1]
        b.steps += 1
        b.tokens += rec.tokens
        b.seconds += rec.seconds + rec.residency_seconds
        b.drafted += rec.drafted
        b.accepted += rec.accepted
        if rec.joules is None:
            b.metered = False
        else:
            b.joules += rec.joules
        if run_s is not None and engine.now_s() >= run_s:
            return self._end(engine, "ended")
        if b.steps < BLOCK_STEPS:
            return []
        if len(self.blocks) % 2 == 0 and (verdict := self._verdict()) is not None:
            return self._end(engine, verdict)
        # the next block: the other side, but a new pair starts on the side the last pair ended with
        nxt = b.drafts if len(self.blocks) % 2 == 0 else not b.drafts
        self.blocks.append(_Block(drafts=nxt))
        self._set(engine, nxt)
        return []

    def _set(self, engine: EngineView, drafts: bool) -> None:
        assert self.auto is not None
        want = self.auto if drafts else DraftSetting(0)
        if self.expected == want:
            return
        try:
            engine.request(Control(draft=want))
        except UserError:  # the model cannot take it now: nothing moved
            return
        self.expected = want
        self.cost.switches += 1

    def _diffs(self, blocks: list[_Block]) -> list[float]:
        """Per pair: log(drafts' figure / none's), the figure tokens per second, or per joule (see objective)."""
        out = []
        for k in range(0, len(blocks) - 1, 2):
            a, b = blocks[k], blocks[k + 1]
            d, n = (a, b) if a.drafts else (b, a)
            if self.objective == "joules_per_token":
                if d.metered and n.metered and d.joules > 0 and n.joules > 0 and d.tokens > 0 and n.tokens > 0:
                    out.append(math.log((d.tokens / d.joules) / (n.tokens / n.joules)))
            elif d.seconds > 0 and n.seconds > 0 and d.tokens > 0 and n.tokens > 0:
                out.append(math.log((d.tokens / d.seconds) / (n.tokens / n.seconds)))
        return out

    def _bounds(self, blocks: list[_Block]) -> tuple[float, float, float] | None:
        """The pairs' mean log ratio with its two-sided 95% bounds; None under two pairs."""
        d = self._diffs(blocks)
        if len(d) < 2:
            return None
        m = statistics.fmean(d)
        half = t95(len(d) - 1) * statistics.stdev(d) / math.sqrt(len(d))
        return m, m - half, m + half

    def _verdict(self) -> str | None:
        pairs = len(self.blocks) // 2
        b = self._bounds(self.blocks)
        bar = math.log1p(BAR)
        if pairs >= MIN_PAIRS and b is not None and b[1] > bar:
            return "kept"
        if pairs >= MIN_PAIRS and b is not None and b[2] < bar:
            return "off"
        return "gave up" if pairs >= MAX_PAIRS else None

    def _end(self, engine: EngineView, result: str) -> list[TuneEvent]:
        """An experiment's end: the swarm at the verdict (the incumbent unless kept or shown off), its record,
        its cost."""
        blocks, self.blocks = self.blocks, []
        inc = self._incumbent
        self.on = {"kept": True, "off": False, "gave up": inc, "ended": inc, "abandoned": inc}[result]
        if result != "abandoned":
            self._set(engine, self.on)
        self.since = 0
        if self.on:  # contexts grow: drafts that pay are measured again soon, those that do not less and less
            self.retry = self.wait_steps = RETRY_STEPS
        else:
            self.wait_steps, self.retry = self.retry, min(2 * self.retry, RETRY_MAX)
        # as the tuner's other experiments: what the candidate's blocks made fewer than the incumbent's rate
        # would have over the same seconds (negative where it gained)
        ins = [x for x in blocks if x.drafts == inc and x.steps]
        cands = [x for x in blocks if x.drafts != inc and x.steps]
        rate = sum(x.tokens for x in ins) / max(sum(x.seconds for x in ins), 1e-9) if ins else 0.0
        lost = sum(rate * x.seconds - x.tokens for x in cands) if ins else 0.0
        seconds = sum(x.seconds for x in blocks)
        self.cost.experiments += 1
        self.cost.experiment_s += seconds
        self.cost.tokens_lost += lost
        b = self._bounds(blocks)
        gain, low, high = (None, None, None) if b is None else tuple(math.expm1(x) for x in b)
        drafted, accepted = sum(x.drafted for x in blocks), sum(x.accepted for x in blocks)
        src = "measured" if engine.backend.source == "measured" else "simulated"
        said = "not measured" if gain is None else f"{gain:+.1%} (95%: {low:+.1%} to {high:+.1%}) ({src})"
        held = "drafts on" if self.on else "drafts off"
        what = {"kept": f"drafts kept: past +{BAR:.0%}", "off": f"drafts off: short of +{BAR:.0%}",
                "gave up": f"{held}: no verdict after {len(blocks) // 2} pairs",
                "ended": f"{held}: the run ended first",
                "abandoned": "abandoned: the draft length was set by hand"}[result]
        figure = "decode tokens/J" if self.objective == "joules_per_token" else "decode tok/s"
        why = (f"tune speculation: the rule's drafts against none over {len(blocks) // 2} interleaved pairs of "
               f"{BLOCK_STEPS} decode steps: {figure} {said}; {accepted:,} of {drafted:,} drafted "
               f"tokens kept; {what}; {lost:+.0f} tokens lost to it; next in {self.wait_steps} decode steps")
        return [Speculated(result=result, pairs=len(blocks) // 2, gain=gain, low=low, high=high, drafted=drafted,
                           accepted=accepted, seconds_drafts=sum(x.seconds for x in blocks if x.drafts),
                           seconds_none=sum(x.seconds for x in blocks if not x.drafts), tokens_lost=lost, why=why,
                           source=src)]

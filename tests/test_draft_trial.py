"""Speculation as the tuner's move (issue 52): under --draft auto and the tuner, the measured rule's drafts
are tried against none in interleaved pairs of blocks and kept only where the pairs say they gain; the
experiment's cost is the tuner's, and a length set by hand ends its say."""

import itertools
import math

import pytest

from swarmtune.engine.backends.sim_backend import _WORDS, SimBackend
from swarmtune.engine.control import Control
from swarmtune.engine.engine import Engine, EngineSettings
from swarmtune.engine.model.profiles import profile
from swarmtune.engine.record.records import StepRecord
from swarmtune.engine.settings import DraftSetting
from swarmtune.engine.tune.events import Speculated, event_from_json
from swarmtune.engine.tune.goal import Goal
from swarmtune.engine.tune.tuner import Tuner
from swarmtune.tui.stats import Stats
from swarmtune.tui.widgets.status import status_text
from tests.conftest import SIM


def _goal() -> Goal:
    return Goal(run_s=300.0, forecast_seeds=1, horizon_s=20.0, epoch_s=30.0)  # short looks: a quick test


def _swarm() -> tuple[Engine, Tuner]:
    p = profile(SIM)
    s = EngineSettings(agents=4, batch_cap=4, seed=3, gen_tokens=256, tool_tokens=256, ctx_per_agent=8192,
                       draft_tokens=8, draft_auto=True, check=True)
    tuner = Tuner(_goal())
    return Engine(SimBackend(p), s, tuner=tuner, autotune=True), tuner


def _spoken(recs: list[StepRecord]) -> list[Speculated]:
    return [r.tune for r in recs if r.kind == "tune" and isinstance(r.tune, Speculated)]


def test_drafts_that_are_never_kept_are_turned_off_on_measurement():
    # the simulated card draws words at random: the n-gram drafts are almost never what it draws
    e, tuner = _swarm()
    recs = [e.step() for _ in range(1500)]
    said = _spoken(recs)
    assert said, "no speculation experiment"
    first = said[0]
    assert first.result in ("off", "gave up") and first.pairs >= 3 and first.high is not None
    assert first.high < 0.05 and first.source == "simulated"
    assert event_from_json(first.to_json()) == first
    at = next(i for i, r in enumerate(recs) if r.tune is first)
    after = [r for r in recs[at + 1:] if r.kind == "decode"][:200]
    assert after and {r.draft_setting for r in after} == {"0"} and not any(r.drafted for r in after)
    assert tuner.cost.experiments >= 1 and tuner.cost.switches >= 2 and tuner.cost.experiment_s > 0
    # the dashboard's status line says the verdict and what was measured
    stats = Stats(tuner_on=True)
    for r in recs[:at + 1]:
        stats.add(r)
    assert f"; drafts off {first.gain:+.1%} (95% " in status_text(stats, "", False).plain
    e.close()


def test_drafts_that_are_kept_stay_on(monkeypatch):
    # each sequence draws the same five words over and over: its own n-grams draft what it will draw, and on
    # the card a verified row costs little beside the weight stream
    counters: dict[int, itertools.count] = {}

    def cyclic(self: SimBackend, seq: int) -> int:
        n = next(counters.setdefault(seq, itertools.count()))
        return self.text.id_of(" " + _WORDS[n % 5])

    monkeypatch.setattr(SimBackend, "_sample", cyclic)
    e, _ = _swarm()
    recs = [e.step() for _ in range(1200)]
    said = _spoken(recs)
    assert said and said[0].result == "kept", [s.why for s in said]
    assert said[0].low is not None and said[0].low > 0.01 and said[0].accepted > 0
    at = next(i for i, r in enumerate(recs) if r.tune is said[0])
    after = [r for r in recs[at + 1:] if r.kind == "decode"][:100]
    assert {r.draft_setting for r in after} == {"auto"} and any(r.drafted for r in after)
    e.close()


@pytest.mark.parametrize("length", [4, 0])
def test_a_length_set_by_hand_ends_the_tuners_say(length):
    e, tuner = _swarm()
    recs = []
    while not tuner.drafting.running:
        recs.append(e.step())
        assert len(recs) < 2000
    e.request(Control(draft=length))  # 0 too: a person who turns drafts off keeps them off
    recs += [e.step() for _ in range(600)]
    said = _spoken(recs)
    assert [s.result for s in said] == ["abandoned"]
    assert e.state().draft == DraftSetting(length) and tuner.drafting.auto is None
    assert {r.draft_setting for r in recs[-300:] if r.kind == "decode"} == {str(length)}


def test_a_fixed_length_is_left_alone():
    s = EngineSettings(agents=4, batch_cap=4, seed=3, ctx_per_agent=8192, draft_tokens=4)
    e = Engine(SimBackend(profile(SIM)), s, tuner=Tuner(_goal()), autotune=True)
    recs = [e.step() for _ in range(800)]
    assert not _spoken(recs) and {r.draft_setting for r in recs if r.kind == "decode"} == {"4"}
    e.close()


def test_under_joules_per_token_a_block_is_judged_on_tokens_per_joule():
    """A verified row costs energy as well as seconds: under the tuner's joules_per_token the pairs compare
    tokens per joule, and a block some step of which was not metered gives no pair."""
    from swarmtune.engine.tune.cost import Spending
    from swarmtune.engine.tune.draft_trial import DraftTrial, _Block

    t = DraftTrial(Spending())
    # drafts: 20% more tokens a second, at 50% more watts
    blocks = [_Block(drafts=False, steps=16, tokens=100, seconds=1.0, joules=100.0),
              _Block(drafts=True, steps=16, tokens=120, seconds=1.0, joules=150.0)]
    assert t._diffs(blocks) == pytest.approx([math.log(1.2)])
    t.objective = "joules_per_token"
    assert t._diffs(blocks) == pytest.approx([math.log((120 / 150) / (100 / 100))])
    blocks[1].metered = False
    assert t._diffs(blocks) == []


def test_the_trial_says_which_figure_it_judged():
    p = profile(SIM)
    s = EngineSettings(agents=4, batch_cap=4, seed=3, gen_tokens=256, tool_tokens=256, ctx_per_agent=8192,
                       draft_tokens=8, draft_auto=True, check=False)
    tuner = Tuner(Goal(run_s=300.0, forecast_seeds=1, horizon_s=20.0, epoch_s=30.0, objective="joules_per_token"))
    e = Engine(SimBackend(p), s, tuner=tuner, autotune=True)
    said = _spoken([e.step() for _ in range(1200)])
    e.close()
    assert said and "decode tokens/J" in said[0].why and said[0].pairs >= 1, [x.why for x in said]

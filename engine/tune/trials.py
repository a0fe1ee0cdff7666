"""The tuner's hands: its moves (each asked of the engine as a person would, each KV switch's rebuild counted
as its cost) and the experiment under way, block by block to its verdict and its report."""

from collections.abc import Callable

from swarmtune.engine.control import Control
from swarmtune.engine.engine_view import EngineView
from swarmtune.engine.errors import UserError
from swarmtune.engine.record.records import StepRecord, mean_context
from swarmtune.engine.tune.cost import Spending
from swarmtune.engine.tune.events import Experimented, TuneEvent
from swarmtune.engine.tune.experiment import Experiment
from swarmtune.engine.tune.forecast import Forecaster
from swarmtune.engine.tune.goal import Goal, Setting
from swarmtune.engine.tune.measured import Measured
from swarmtune.engine.tune.outcome import ForecastChecks
from swarmtune.engine.tune.propose import BLOCK_PER_SWITCH, Proposer
from swarmtune.engine.tune.report import ended
from swarmtune.engine.tune.verdict import Judge, forecast_verdict, learned_scale


def setting_of(engine: EngineView) -> Setting:
    """The setting in force, or about to be (a change requested and not yet applied over it)."""
    st = engine.state()
    return Setting(st.batch_cap, st.kv or engine.s.kv, st.residency)


class Trials:
    def __init__(self, goal: Goal, measured: Measured, cost: Spending, checks: ForecastChecks, judge: Judge,
                 forecaster: Forecaster, proposer: Proposer, on_end: Callable[[float], None]) -> None:
        self.goal = goal
        self.measured, self.cost, self.checks = measured, cost, checks
        self.judge, self.fc, self.proposer = judge, forecaster, proposer
        self.on_end = on_end  # an experiment ended at this time: the next look is an epoch from it
        self.restart()

    def restart(self) -> None:
        self.exp: Experiment | None = None
        self.switching = False  # a KV switch asked for: its rebuild record is the tuner's cost
        self.explored_s = 0.0  # engine seconds of exploratory experiments (both sides' blocks)

    def account(self, rec: StepRecord) -> None:
        """A rebuild the tuner asked for is its cost: its seconds and the cells it converted or prefilled."""
        if rec.kind != "rebuild" or not self.switching:
            return
        self.switching = False
        seconds = rec.seconds + rec.residency_seconds
        cells = rec.converted_tokens + rec.tokens
        self.cost.switch_s += seconds
        self.cost.switch_cells += cells
        if self.exp is not None:
            self.exp.switch_s += seconds
            self.exp.switch_cells += cells
            # the blocks grow with what a switch measured: its share of the experiment stays small (up to
            # MAX_BLOCK_EPOCHS epochs: a switch dearer than that makes the experiment give up, below)
            self.exp.block_s = max(self.exp.block_s, BLOCK_PER_SWITCH * seconds)
        if cells:
            self.measured.switched(float(cells), seconds)

    def move(self, engine: EngineView, cur: Setting, to: Setting) -> bool:
        if cur == to:
            return True
        try:
            engine.request(Control(batch_cap=to.batch_cap if to.batch_cap != cur.batch_cap else None,
                                   kv=to.kv if to.kv != cur.kv else None,
                                   residency=to.residency if to.residency != cur.residency else None))
        except UserError:  # the swarm changed under it (agents removed meanwhile)
            return False
        self.cost.switches += 1
        if to.kv != cur.kv:
            self.switching = True
        self.checks.drop_moved(setting_of(engine))
        return True

    def step(self, engine: EngineView, rec: StepRecord) -> list[TuneEvent]:
        """The experiment under way takes this record: its next block, its verdict after a pair, or its end."""
        x = self.exp
        assert x is not None
        live = setting_of(engine)
        if live not in (x.incumbent, x.candidate) and not self.switching:
            return self.end(engine, "abandoned", live)  # a person moved the setting under it
        before = sum(b.tally.seconds for b in x.blocks)
        nxt = x.add(rec, live)
        spent = sum(b.tally.seconds for b in x.blocks) - before
        self.cost.experiment_s += spent
        if x.exploratory:
            self.explored_s += spent
        if nxt is None:
            if self.goal.run_s is not None and engine.now_s() >= self.goal.run_s - 1e-9:
                return self.end(engine, "ended", live)
            return []
        verdict = self.judge.judge(engine, x) if len(x.blocks) % 2 == 1 else None  # a pair just closed
        if verdict is None and len(x.blocks) % 2 == 1 and not self.judge.room_for_a_pair(engine, x):
            verdict = "gave up"
        if verdict is not None:
            return self.end(engine, verdict, live)
        self.move(engine, live, x.setting_for(nxt))
        return []

    def end(self, engine: EngineView, result: str, live: Setting) -> list[TuneEvent]:
        """An experiment's end: the swarm at the winner (the incumbent unless kept), its record, its cost."""
        x = self.exp
        assert x is not None
        self.exp = None
        mean_ctx = mean_context([a.context for a in engine.agents])
        if result != "abandoned":
            self.move(engine, live, x.candidate if result == "kept" else x.incumbent)
            self.proposer.remember_tried(engine, x.incumbent if result == "kept" else x.candidate)
        lost = x.tokens_lost()
        self.cost.tokens_lost += lost
        self.on_end(engine.now_s())  # the next look an epoch from now, on the setting it holds
        self.checks.drop_moved(setting_of(engine))
        if (scale := learned_scale(x)) is not None:
            self.fc.measured_scale[x.candidate.kv] = scale
        return ended(x, result, live, forecast_verdict(x), lost, self.goal, engine.backend.source, mean_ctx,
                     self.fc.horizon_at(engine.now_s()), self.cost, engine.now_s())

    def outcome_now(self, engine: EngineView) -> Experimented | None:
        """An experiment still running when the run ends: what it measured so far (no verdict on the setting;
        the forecast's verdict where there are pairs enough). The swarm is left as it is."""
        if self.exp is None:
            return None
        out = self.end(engine, "ended", setting_of(engine))
        return next((e for e in out if isinstance(e, Experimented)), None)

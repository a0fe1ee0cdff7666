"""The auto-tuner, a package of its own: `goal.py` (objectives, constraints, the setting it moves),
`tally.py` (what a stretch of steps did), `simulator.py` (this run, calibrated, to forecast with),
`watch.py` (the closed loop: each step after a change against its forecast's model) and `tuner.py` (the
decisions and their outcomes). It talks to the engine only through its public methods: `Engine.fork`
for a forecast, `Engine.request` for a change, the records it is shown."""

from swarmtune.engine.tune.goal import OBJECTIVES, Goal, Setting, parse_allowed_kv, parse_objective
from swarmtune.engine.tune.tally import SpanTally, Tally
from swarmtune.engine.tune.tuner import Tuner

__all__ = ["OBJECTIVES", "Goal", "Setting", "SpanTally", "Tally", "Tuner", "parse_allowed_kv", "parse_objective"]

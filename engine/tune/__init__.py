"""The auto-tuner, a package of its own: `goal.py` (objectives, constraints, the setting it moves),
`tally.py` (what a stretch of steps did), `simulator.py` (this run, calibrated, to forecast with),
`experiment.py` (a setting tried on the live swarm against the incumbent, in interleaved blocks),
`cost.py` (what the tuner spends) and `tuner.py` (proposals, experiments, what they found). It talks to
the engine only through its public methods: `Engine.fork` for a forecast, `Engine.request` for a change,
the records it is shown."""

from swarmtune.engine.tune.goal import OBJECTIVES, Goal, Setting, parse_allowed_kv, parse_objective
from swarmtune.engine.tune.tally import SpanTally, Tally
from swarmtune.engine.tune.tuner import Tuner

__all__ = ["OBJECTIVES", "Goal", "Setting", "SpanTally", "Tally", "Tuner", "parse_allowed_kv", "parse_objective"]

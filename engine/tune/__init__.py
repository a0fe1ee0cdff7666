"""The auto-tuner, a package of its own: `goal.py` (objectives, constraints, the setting it moves), `tally.py`
(what a stretch of steps did), `simulator.py` (this run, calibrated, to forecast with), `experiment.py` (a
setting tried on the live swarm against the incumbent, in interleaved blocks), `cost.py` (what the tuner
spends), `measured.py` (what it learned of this machine: prefill, swap and switch rates, side-cache probes;
the calibrated simulator on them), `shadow.py` (the live engine's shadow on a simulator, built from
`Engine.snapshot`, which every forecast runs), `forecast.py` (the swarm run forward under a setting; the
thinking it costs), `outcome.py` (forecasts of staying checked against what came: the stated error),
`propose.py` (the neighbours, and which one is worth an experiment), `verdict.py` (an experiment's verdicts
after each pair), `report.py` (what its end says), `trials.py` (its moves, and the experiment under way to its
end), `quality_guard.py` (the quality budget's move back to f16), `budget_outlook.py` (when the KV budget
binds, and the ways out a look weighed) and `tuner.py` (the wiring: what the engine calls after every record).
It sees the engine through `EngineView` (engine/engine_view.py): read-only, and it changes the engine only
through `request`, as a person would; it learns from the records it is shown (a refused KV type among them).
Its modules are imported by name (`swarmtune.engine.tune.tuner`): the package imports none of them, as the
records below it hold its events (`events.py`)."""


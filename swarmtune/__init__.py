"""swarmtune: tune an agent swarm that shares one GPU (or a CPU).

Layers, each importing only those below it (the import contract in pyproject.toml checks it):
`swarmtune.cli` (commands) > `swarmtune.tui` (the dashboard) > `swarmtune.engine.server` >
`swarmtune.engine.sources` > the engine core (`swarmtune.engine`: model facts, backends, workload,
scheduler, engine, records, power)."""

__version__ = "0.2.0"

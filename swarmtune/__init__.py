"""swarmtune: tune an agent swarm that shares one GPU (or a CPU).

Layers, each importing only those below it (the import contract in pyproject.toml checks it):
`swarmtune.cli` (commands) > `swarmtune.tui` (the dashboard) > `swarmtune.server` (the HTTP APIs) >
`swarmtune.sources` (what a dashboard or a recording reads: a live engine, a recording, a remote node, an
attached engine, a fleet) > the engine core (`swarmtune.engine`: model facts, backends, agents, the step,
measurement, the tuner)."""

__version__ = "0.2.0"

"""swarmtune's engine core: batched multi-agent decode on llama.cpp (or simulated), byte accounting,
step records, measurement and the tuner, grouped by what each answers (`model/`, `conversation/`,
`backends/`, `measure/`, `agents/`, the step here, `quality/`, `tune/`; CONTRIBUTING.md lists them). It
imports no source, server, dashboard or CLI (the import contract in pyproject.toml holds it to that, and
orders the groups); `swarmtune/sources/` and `swarmtune/server/` sit above it."""

"""swarmtune's engine core: batched multi-agent decode on llama.cpp (or simulated), byte accounting,
step records and power. It imports no source, server, dashboard or CLI (the import contract in
pyproject.toml holds it to that); `sources/` and `server/` sit above it, inside this folder."""

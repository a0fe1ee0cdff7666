"""Sources of step records: what the dashboard, `record` and `serve` consume (protocol.py).

A live engine (live.py), a recording (replay.py), a `swarmtune serve` elsewhere (remote.py, client.py),
and engines people already run, read-only (attached.py, pollers.py). One paced loop drives the ones that
produce records themselves (driver.py); the network ones share one backoff (backoff.py)."""

"""swarmtune serve: the engine headless behind an HTTP API (server.py), its runner thread and metrics."""

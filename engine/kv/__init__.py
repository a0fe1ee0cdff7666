"""The KV cache: its types, its budget, switching a live swarm to another type and converting its cells."""

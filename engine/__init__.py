"""swarmtune's engine: batched multi-agent decode, byte accounting and step records.

Nothing in this package imports the UI; `tests/test_import_hygiene.py` holds it to that.
"""

__version__ = "0.1.0"

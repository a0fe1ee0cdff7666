"""`python -m swarmtune`: the same as the `swarmtune` command."""

from swarmtune.cli import entry

if __name__ == "__main__":
    entry()

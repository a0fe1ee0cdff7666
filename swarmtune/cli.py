"""The `swarmtune` command, the top layer: it parses the flags, builds a source (a live engine, a recording,
a remote engine) and hands it to the dashboard, `record` or `serve`. Bad input ends in one line on stderr
and exit status 2, never a traceback."""

import argparse
import os
import sys
from collections.abc import Callable

from swarmtune.commands.dashboard import cmd_attach, cmd_replay, cmd_run
from swarmtune.commands.fleet import cmd_fleet
from swarmtune.commands.info import cmd_power, cmd_profiles
from swarmtune.commands.quality import cmd_quality
from swarmtune.commands.record import cmd_record
from swarmtune.commands.serve import cmd_serve
from swarmtune.commands.sweep import cmd_sweep
from swarmtune.commands.tune import cmd_tune
from swarmtune.engine.errors import UserError
from swarmtune.parsing import EXIT_BAD_INPUT, build_parser

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": cmd_run, "tune": cmd_tune, "record": cmd_record, "replay": cmd_replay, "sweep": cmd_sweep,
    "profiles": cmd_profiles, "power": cmd_power, "serve": cmd_serve, "attach": cmd_attach,
    "quality": cmd_quality, "fleet": cmd_fleet,
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        argv = ["run", *argv]
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except UserError as e:
        print(f"swarmtune: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # a bug, not bad input: still one line, the traceback only on request
        if os.environ.get("SWARMTUNE_DEBUG"):
            raise
        print(f"swarmtune: internal error: {type(e).__name__}: {e} (SWARMTUNE_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        return 1


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()

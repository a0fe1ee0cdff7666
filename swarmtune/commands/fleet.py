"""`swarmtune fleet`: the nodes a Prometheus server scrapes, in one dashboard (or one JSON snapshot)."""

import argparse
import dataclasses
import json
import math
import os
import sys

from swarmtune.engine.errors import UserError
from swarmtune.sources.fleet import PrometheusFleet


def node_tokens(pairs: list[str]) -> dict[str, str]:
    """--node-token HOST:PORT=TOKEN, repeatable: the node's instance as Prometheus scrapes it."""
    out: dict[str, str] = {}
    for p in pairs:
        node, sep, token = p.partition("=")
        if not sep or not node or not token:
            raise UserError(f"--node-token takes HOST:PORT=TOKEN (got {p!r})")
        out[node] = token
    return out


def cmd_fleet(args: argparse.Namespace) -> int:
    if not math.isfinite(args.interval) or args.interval < 0.2:
        raise UserError(f"--interval must be at least 0.2 seconds (got {args.interval})")
    tokens = node_tokens(args.node_tokens)
    default_token = args.token or os.environ.get("SWARMTUNE_TOKEN") or None
    fleet = PrometheusFleet(args.url)
    if args.json:
        try:
            snap = fleet.read()
        finally:
            fleet.close()
        json.dump(dataclasses.asdict(snap), sys.stdout, indent=1)
        print()
        return 0
    try:
        from swarmtune.tui.fleet_app import run_fleet
    except ImportError as e:
        fleet.close()
        raise UserError(f"the fleet dashboard needs textual ({e}); --json prints one snapshot") from None
    return run_fleet(fleet, args.interval, tokens, default_token)

"""`swarmtune profiles` and `swarmtune power`: what this machine offers."""

import argparse


def cmd_profiles(args: argparse.Namespace) -> int:
    from swarmtune.engine.model.profiles import PROFILES

    for p in PROFILES.values():
        print(f"{p.name:24} {p.description}")
        print(f"{'':24} {p.bytes_model.kind}: W(1) {p.weight_bytes / 1e9:.3g} GB, "
              f"k(f16) {p.kv_bytes_per_token_f16 / 1e3:.3g} KB, "
              f"{p.power_floor_watts:.0f} W + {p.power_per_agent_watts:.0f} W/agent; {p.source}")
    return 0


def cmd_power(args: argparse.Namespace) -> int:
    from swarmtune.engine.measure.power.sensors import survey

    for a in survey(args.sysfs_root):
        print(f"{a.name:8} {'available' if a.available else 'n/a':10} {a.reason}")
    print(f"{'modeled':8} {'available':10} "
          "with --sim PROFILE: the profile's floor + per-agent watts (labelled modeled)")
    return 0

"""What the GPU check measured, from the sweep's JSON: the seed's table and the energy ledger, in Markdown
ready for the README, and the check's bars (every row measured; the energy source, when one is expected).

    python bench/gpu/summarize.py sweep.json --expect-power measured:nvml --machine "NVIDIA H200" --out summary.md
"""

import argparse
import json
import sys
from pathlib import Path


def _f(x: float | None, fmt: str) -> str:
    return "n/a" if x is None else format(x, fmt)


def bars(sweep: dict, expect_power: str) -> list[str]:
    """What fails the check (empty when it passes)."""
    rows = sweep["rows"]
    bad = []
    if not rows:
        bad.append("the sweep has no rows")
    not_measured = sorted({r["source"] for r in rows} - {"measured"})
    if not_measured:
        bad.append(f"rows that are not measured: source {', '.join(not_measured)}")
    if expect_power != "any":
        wrong = sorted({str(r.get("power_source")) for r in rows} - {expect_power})
        if wrong:
            bad.append(f"energy columns not {expect_power}: {', '.join(wrong)}")
    return bad


def summary(sweep: dict, machine: str) -> str:
    rows = sweep["rows"]
    bmax = max(r["batch"] for r in rows)
    one = {r["context"]: r for r in rows if r["batch"] == 1}
    top = [r for r in rows if r["batch"] == bmax]
    fit = sweep.get("fit_rms_relative_error")
    lines = [
        f"{machine}: {sweep['model']}, W {sweep['weight_bytes'] / 1e9:.2f} GB, "
        f"k {sweep['kv_bytes_per_token']:,.0f} B/token (KV {sweep['kv_type']}), {sweep['backend']} on {sweep['device']}"
        + (f"; calibrated fit rms error {fit:.1%}" if fit is not None else ""),
        "",
        f"| context per agent | 1-agent tok/s | {bmax}-agent tok/s | {bmax}-agent speedup (measured) "
        "| seed formula (modeled) | calibrated (modeled) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in top:
        cal = r.get("calibrated_speedup")
        base = one[r["context"]]["tokens_per_second"]
        lines.append(f"| {r['context']:,} | {base:,.1f} | {r['tokens_per_second']:,.1f} | {r['speedup']:.2f}x "
                     f"| {r['predicted_speedup']:.2f}x | {'n/a' if cal is None else format(cal, '.2f') + 'x'} |")
    lines += ["", "| batch | context | tok/s | watts | J/token | tokens/J | power source |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['batch']} | {r['context']:,} | {r['tokens_per_second']:,.1f} | {_f(r.get('watts'), '.0f')} "
                     f"| {_f(r.get('joules_per_token'), '.3f')} | {_f(r.get('tokens_per_joule'), '.2f')} "
                     f"| {r.get('power_source') or 'n/a'} |")
    return "\n".join(lines) + "\n"


def smi_line(path: Path) -> str:
    """Peaks from `nvidia-smi --query-gpu=... --format=csv -lms N`: a second opinion on watts, load and memory."""
    rows = [line.split(",") for line in path.read_text().splitlines() if line.strip()]
    if len(rows) < 2:
        return f"nvidia-smi: no samples in {path.name}"
    head = [h.strip().split(" ")[0].replace("clocks.current.", "clocks.") for h in rows[0]]
    peaks: dict[str, float] = {}
    n = 0
    for r in rows[1:]:
        if len(r) != len(head):
            continue
        n += 1
        for h, v in zip(head, r, strict=True):
            try:
                x = float(v.strip().split(" ")[0])
            except ValueError:
                continue
            peaks[h] = max(peaks.get(h, x), x)
    parts = [f"{label} {peaks[key]:,.0f}{unit}" for key, label, unit in (
        ("power.draw", "peak", " W"), ("utilization.gpu", "peak load", "%"), ("memory.used", "peak memory", " MiB"),
        ("clocks.sm", "SM clock up to", " MHz"), ("clocks.memory", "memory clock", " MHz")) if key in peaks]
    return f"nvidia-smi during the sweep ({n} samples): " + (", ".join(parts) or "no readable values")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="summarize.py", description=__doc__.split("\n\n")[0])
    p.add_argument("sweep_json", type=Path)
    p.add_argument("--expect-power", default="any", help="the power source every row must carry, or 'any'")
    p.add_argument("--machine", default="this machine", help="label for the figures (e.g. the GPU's name)")
    p.add_argument("--out", type=Path, help="also write the Markdown here")
    p.add_argument("--smi", type=Path, help="nvidia-smi's CSV samples over the sweep, summarized in one line")
    args = p.parse_args(argv)
    try:
        sweep = json.loads(args.sweep_json.read_text())
    except (OSError, ValueError) as e:
        print(f"summarize: cannot read {args.sweep_json}: {e}", file=sys.stderr)
        return 1
    text = summary(sweep, args.machine)
    if args.smi:
        text += "\n" + smi_line(args.smi) + "\n"
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    bad = bars(sweep, args.expect_power)
    for b in bad:
        print(f"check: bar not met: {b}", file=sys.stderr)
    if not bad:
        print(f"check: bars met: every row measured; power {args.expect_power}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

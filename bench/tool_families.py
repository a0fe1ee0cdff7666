"""canitoolcall's conformance suite (469 recorded replies of nine families) through swarmtune's parsing.

Runs `canitoolcall run` with swarmtune's adapter (tests/toolcall_adapter.py), prints canitoolcall's own
per-family lines, then a case's outcome per way of reading it: in one piece (the non-streamed parse and the
`one` stream), streamed by tokens' worth of characters (`token`, `rand:1..5:8`) and by characters (the
suite's synthetic `char:0..3`). A case passes a way when every check of it passes or soft-passes.

    python bench/tool_families.py [--family qwen3-xml] [--failures]"""

import argparse
import json
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WAYS = {"one piece": ("nonstream", "one"), "token-ish": ("token", "rand:1:8", "rand:2:8", "rand:3:8", "rand:4:8",
                                                        "rand:5:8"),
        "char-streamed": ("char:0", "char:1", "char:2", "char:3")}
STRATEGIES = [s for ways in WAYS.values() for s in ways if s != "nonstream"]
OK = ("pass", "soft_pass")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", action="append", default=[], help="only this family (repeatable)")
    ap.add_argument("--failures", action="store_true", help="list each failing case and its failing checks")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "canitoolcall", "run", "--engine", "toolcall_adapter:Swarmtune",
               "--python", sys.executable, "--env", f"PYTHONPATH={ROOT / 'tests'}", "--out", out,
               "--observed", "failures", *(f"--strategy={s}" for s in STRATEGIES),
               *(f"--family={f}" for f in args.family)]
        run = subprocess.run(cmd, text=True, capture_output=True)
        print(run.stdout, end="")
        if run.returncode not in (0, 1):
            print(run.stderr, file=sys.stderr, end="")
            return run.returncode
        results = json.loads(next(Path(out).glob("*.json")).read_text())
    table: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    failing: list[str] = []
    for case in results["cases"]:
        for way, strategies in WAYS.items():
            rows = [c for c in case["checks"] if c["strategy"] in strategies or c["strategy"] == "*"]
            ok = all(c["status"] in OK for c in rows)
            table[case["family"]][way][0] += ok
            table[case["family"]][way][1] += 1
        bad = sorted({f"{c['check']}@{c['strategy']}" for c in case["checks"] if c["status"] not in OK})
        if bad:
            failing.append(f"{case['fixture_id']}: {', '.join(bad)}")
    print(f"\n{'family':14}" + "".join(f"{w:>22}" for w in WAYS))
    worst = 1.0
    for fam in sorted(table):
        cells = []
        for way in WAYS:
            ok, n = table[fam][way]
            worst = min(worst, ok / n)
            cells.append(f"{ok}/{n} ({100 * ok / n:.1f}%)")
        print(f"{fam:14}" + "".join(f"{c:>22}" for c in cells))
    print(f"worst family, any way: {100 * worst:.1f}% of its cases pass (pass or soft pass)")
    if args.failures:
        print("\nfailing cases:")
        print("\n".join(failing) or "none")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the tuner costs a swarm it cannot speed up: is it all in what the tuner counts?

On the changing workload of bench/autotune.py (the default model on this CPU, where f16 is the best setting
throughout and the tuner holds still), three arms run the same turns: static f16 (the tuner's start); a
tuner that is handed every record and keeps its books (the measured steps, the recent noise, its checks)
but never looks or probes (what carrying a tuner costs); and the tuner itself. Each round runs them in the
order A B C C B A, so a drift of the machine's speed weighs on every arm alike; every figure is a mean over
the rounds' runs with their min-max beside it. Beside each run: the wall seconds Tuner.observe took
(measured around it) and what the tuner counted it spent (its thinking and its probes). Where the tuner's
shortfall against the watching arm is what it counted, its cost is all accounted, and cutting it is cutting
what it counts.

    python bench/tuner_cost.py              # 3 rounds (~26 min on a 2-core box)
    python bench/tuner_cost.py --rounds 5 --json out.json
"""

import argparse
import json
import os
import time

os.environ.setdefault("SWARMTUNE_CHECK", "0")

from autotune import CHANGING, run  # bench/, next to this script
from machine import cpu_name

from swarmtune.engine.engine_view import EngineView
from swarmtune.engine.record.records import StepRecord
from swarmtune.engine.tune.events import TuneEvent
from swarmtune.engine.tune.goal import Goal
from swarmtune.engine.tune.tuner import Tuner


class TimedTuner(Tuner):
    """The tuner, its every call from the engine timed on the wall."""

    def __init__(self, goal: Goal) -> None:
        super().__init__(goal)
        self.observe_s = 0.0

    def observe(self, engine: EngineView, rec: StepRecord) -> list[TuneEvent]:
        t0 = time.perf_counter()
        try:
            return super().observe(engine, rec)
        finally:
            self.observe_s += time.perf_counter() - t0


class WatchingTuner(TimedTuner):
    """Keeps its books on every record; never forecasts, proposes or probes. It stops the two private calls
    that do (Tuner.observe's looks and its probe by conversion): were either renamed, this arm would tune,
    and its `observe` seconds, printed, would be the tuner's."""

    def _look(self, engine: EngineView, now: float, kv_only: bool = False,
              probed: bool = False) -> list[TuneEvent]:
        self._looked, self._epoch_start_s = True, now
        return []

    def _probe_converted(self, engine: EngineView, rec: StepRecord, now: float) -> list[TuneEvent]:
        return []


ARMS: list[tuple[str, type[TimedTuner] | None]] = [("static f16", None), ("watching", WatchingTuner),
                                                  ("tuner", TimedTuner)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds of A B C C B A (at least 3)")
    ap.add_argument("--json", help="write every run here")
    args = ap.parse_args()
    if args.rounds < 3:
        ap.error("--rounds: at least 3 (a spread needs them)")
    if args.json:
        try:  # before 26 minutes of runs, not after
            open(args.json, "w", encoding="utf-8").close()
        except OSError as e:
            ap.error(f"--json: cannot write {args.json}: {e.strerror}")
    from swarmtune.engine.backends.llama_backend import LlamaBackend
    from swarmtune.engine.model.default_model import default_model_path
    from swarmtune.engine.model.model_facts import read_model_facts

    print(f"tuner cost on {cpu_name()}: the changing workload, {args.rounds} rounds of A B C C B A", flush=True)
    backend = LlamaBackend(read_model_facts(default_model_path()))
    backend.text.is_eog = lambda token: False  # type: ignore[method-assign]  # every turn its limit, as autotune's
    runs: dict[str, list[dict]] = {name: [] for name, _ in ARMS}
    made: list[TimedTuner] = []  # the tuned arms' tuners, for what observe took
    try:
        for k in range(args.rounds):
            for name, cls in ARMS + ARMS[::-1]:
                timed = [r["seconds"] for r in runs["static f16"]]
                tuned_s = sum(timed) / len(timed) if timed else None
                before = len(made)

                def make(goal: Goal, cls: type[TimedTuner] = cls or TimedTuner) -> Tuner:
                    made.append(cls(goal))
                    return made[-1]
                r = run(lambda: backend, CHANGING, 8, "f16", "keep", cls is not None, 1, tuned_s, make_tuner=make)
                r.update(round=k, arm=name, observe_s=made[-1].observe_s if len(made) > before else 0.0)
                runs[name].append(r)
                print(f"  round {k + 1}: {name:10s} {r['tokens_per_s']:6.2f} tok/s ({r['tokens']} tokens in "
                      f"{r['seconds']:.1f} s; observe {r['observe_s']:.2f} s, counted {counted_s(r):.2f} s; measured)",
                      flush=True)
    finally:
        backend.close()

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs)

    base = runs["static f16"]
    for name, _ in ARMS:
        xs = [r["tokens_per_s"] for r in runs[name]]
        secs = [r["seconds"] for r in runs[name]]
        line = f"{name:10s} {mean(xs):6.2f} tok/s ({min(xs):.2f}-{max(xs):.2f}), {mean(secs):.1f} s a run"
        if name != "static f16":
            # per round: the arm's two runs over static f16's two
            per = [mean([r["tokens_per_s"] for r in runs[name] if r["round"] == k])
                   / mean([r["tokens_per_s"] for r in base if r["round"] == k]) for k in range(args.rounds)]
            obs = mean([r["observe_s"] for r in runs[name]])
            line += (f"; / static f16 {mean(xs) / mean([r['tokens_per_s'] for r in base]):.3f} "
                     f"({min(per):.3f}-{max(per):.3f}); observe {obs:.2f} s a run")
        print(line, flush=True)
    watch, tuner = runs["watching"], runs["tuner"]
    extra_s = mean([r["seconds"] for r in tuner]) - mean([r["seconds"] for r in watch])
    counted = mean([counted_s(r) for r in tuner])
    print(f"tuner's runs took {extra_s:+.2f} s longer than watching's; it counted {counted:.2f} s (thinking and "
          f"probes; measured)", flush=True)
    tokens = {r["tokens"] for rs in runs.values() for r in rs}
    print("the same work in every run: " + (f"{tokens.pop()} decode tokens" if len(tokens) == 1 else
          f"NOT: decode tokens {min(tokens)}-{max(tokens)} (the ratios above compare unlike runs)"), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(plain({"cpu": cpu_name(), "runs": {k: [{x: v for x, v in r.items() if x != "series"}
                                                              for r in rs] for k, rs in runs.items()}}), f, indent=1)


def counted_s(r: dict) -> float:
    """What the tuner counted it spent outright in run r: its thinking and its probes."""
    cost = r["cost"] or {}
    return cost.get("think_s", 0.0) + cost.get("probe_s", 0.0)


def plain(o: object) -> object:
    """JSON's own types all through: a probe's figures are keyed by KV setting."""
    if isinstance(o, dict):
        return {str(k): plain(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [plain(v) for v in o]
    return o


if __name__ == "__main__":
    main()

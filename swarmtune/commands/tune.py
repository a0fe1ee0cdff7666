"""`swarmtune tune`: the tuner headless; the setting it holds as other engines' flags."""

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from swarmtune.commands.record import stop_on_signals
from swarmtune.engine.errors import UserError
from swarmtune.factories import make_engine


def cmd_tune(args: argparse.Namespace) -> int:
    """Headless: the engine with its tuner on for --duration, then the setting it holds, as engine flags."""
    from swarmtune.engine.model.engine_flags import engine_flags
    from swarmtune.engine.spec.draft_model_limits import P_MIN
    from swarmtune.engine.tune.tally import Tally

    args.autotune = args.autotune or "tokens_per_s"
    if args.duration is not None and args.duration <= 0:
        raise UserError(f"--duration must be positive (got {args.duration})")
    if args.json_path and args.json_path != "-" and not Path(args.json_path).parent.exists():
        raise UserError(f"cannot write {args.json_path}: folder {Path(args.json_path).parent} does not exist")
    e = make_engine(args)
    duration = args.duration or (600.0 if e.backend.source == "simulated" else 120.0)
    e.tuner.goal = replace(e.tuner.goal, run_s=duration)
    flag = stop_on_signals()
    decisions, whole, last = [], Tally(), []
    say = (lambda *a: print(*a, file=sys.stderr)) if args.json_path == "-" else print
    try:
        e.start()
        while e.now_s() < duration and not flag["stop"]:
            r = e.step()
            whole.add(r)
            last.append(r)
            if r.kind == "tune" and r.tune is not None:
                decisions.append(r.tune.to_json() | {"t": r.t})
                say(f"{r.t:8.1f} s  {r.note}")
    except KeyboardInterrupt:
        pass
    finally:
        st = e.state()
        kv = st.kv or e.s.kv  # an engine's state always holds one
        tail = Tally()
        for r in last:
            if r.t >= e.now_s() - e.tuner.goal.dwell_s:
                tail.add(r)
        f = e.facts
        prof = getattr(e.backend, "profile", None)
        flags = engine_flags(st.batch_cap, kv, st.residency, e.s.ctx_per_agent, f.bytes_model, f.weight_bytes,
                             e.s.kv_budget_bytes, getattr(prof, "device_memory_bytes", None), e.s.draft_tokens,
                             e.s.draft_auto, e.s.draft_model, P_MIN)
        source = e.backend.source
        ledger = getattr(e.quality, "ledger", None)
        run_s = e.now_s()  # the engine's clock: the tuner's probe and first look, before the first step, count
        e.close()
    result = {
        "objective": e.tuner.goal.objective, "setting": {"batch_cap": st.batch_cap, "kv": kv.label,
                                                         "residency": st.residency},
        "tuned_for_s": round(e.now_s(), 1), "clock": "simulated" if source == "simulated" else "wall",
        "tokens_per_s": {"whole_run": round(whole.tokens / run_s, 2) if run_s > 0 else None,
                         "last_dwell": round(tail.tokens / tail.seconds, 2) if tail.seconds else None,
                         "source": source},
        "decisions": decisions, "engines": [x.as_dict() for x in flags],
        "tuner_cost": e.tuner.cost.to_json(),
        # what the live check measured of each KV setting against f16/f16 (none on the simulated card)
        "kv_quality": {"budget_kl": e.tuner.goal.kv_quality, "figures": ledger.rows() if ledger else [],
                       "source": "measured live on the agents' own histories" if ledger else
                       "not measured: the simulated card has no logits"},
    }
    say(f"best setting: cap {st.batch_cap}, KV {st.kv}, residency {st.residency} "
        f"({result['tokens_per_s']['whole_run']} tok/s over the run, {source})")
    say(e.tuner.cost.line(run_s))
    for fig in ledger.figures.values() if ledger else []:
        say(f"  quality: {fig.line()}")
    for x in flags:
        say(f"  {x.engine:12} {' '.join(x.flags)}")
        for n in x.notes:
            say(f"  {'':12} {n}")
    if args.json_path:
        text = json.dumps(result, indent=2)
        if args.json_path == "-":
            print(text)
        else:
            Path(args.json_path).write_text(text + "\n", encoding="utf-8")
    return 0

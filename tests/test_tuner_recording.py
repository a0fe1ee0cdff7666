"""The tuner's decisions on simulated conditions, compared with a recording: a change that means to move
code, not to change what the tuner does (issue 34's restructure), must leave every tune record as it was,
to the digit. A change that means to change a decision updates the recording in its own commit, saying why:

    python -m pytest tests/test_tuner_recording.py --snapshot-update

The sim's clock does not wait for the tuner's forecasts (Goal.sim_think_s), so these runs are the same on
every machine; the only wall-clock figure in a tune record (the CPU seconds of its thinking) is left out.
The conditions are the bench's (bench/autotune.py), shorter: a stated card, one whose bandwidth is 30% below
the tuner's model, and one where q8_0's KV read costs 2.5x its bytes (the model's sign wrong).
"""

import re

import pytest
from syrupy.extensions.json import JSONSnapshotExtension

from swarmtune.engine.backends.sim_backend import SimBackend
from swarmtune.engine.engine import Engine, EngineSettings
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.model.profiles import misstated, profile
from swarmtune.engine.tune.goal import Goal
from swarmtune.engine.tune.tuner import Tuner

KV = KVSetting.parse  # a KV setting as a flag spells it

SECONDS = 200.0
CONDITIONS = {
    "rx9070xt-seed1": ("rx9070xt-qwen3.5-9b", 1, {}),
    "rx9070xt-seed1-bandwidth-0.7": ("rx9070xt-qwen3.5-9b", 1, {"bandwidth": 0.7}),
    "rtx4090-seed1-q8_0-read-2.5x": ("rtx4090-qwen3.5-9b", 1, {"kv_cost": {"q8_0": 2.5}}),
}
WALL_CLOCK = {"think_cpu_s"}  # measured on this machine's CPU, not on the sim's clock (and said in the why)


def decisions(name: str, seed: int, true: dict) -> dict:
    stated = profile(name)
    card = misstated(stated, true) if true else stated
    s = EngineSettings(agents=8, batch_cap=8, kv=KV("f16"), residency="keep", seed=seed, gen_tokens=256,
                       tool_tokens=1024, ctx_per_agent=stated.context_per_agent,
                       kv_budget_bytes=stated.kv_budget_bytes, tool_latency_s=5.0, check=False)
    e = Engine(SimBackend(card, stated=stated), s, tuner=Tuner(Goal(allowed_kv=(KV("f16"), KV("q8_0")), run_s=SECONDS)),
               autotune=True)
    e.start()
    tokens, events = 0, []
    while e.now_s() < SECONDS:
        r = e.step()
        tokens += r.tokens if r.kind == "decode" else 0
        if r.kind == "tune" and r.tune is not None:
            ev = {k: v for k, v in r.tune.to_json().items() if k not in WALL_CLOCK}
            ev["why"] = re.sub(r"[0-9.]+ CPU s", "(this CPU's) CPU s", ev["why"])
            events.append({"t": r.t, **ev})
    return {"events": events, "decode_tokens": tokens, "seconds": e.now_s(),
            "final": {"cap": e.s.batch_cap, "kv": e.s.kv.label, "residency": e.s.residency}}


@pytest.mark.slow
@pytest.mark.parametrize("condition", sorted(CONDITIONS))
def test_the_tuners_decisions_are_as_recorded(condition, snapshot):
    got = decisions(*CONDITIONS[condition])
    assert any(ev["phase"] == "trial" for ev in got["events"]), "a recording that decides nothing guards nothing"
    assert got == snapshot(extension_class=JSONSnapshotExtension)

"""A decode step that carries a prefill chunk in the same call (engine/spec/mix_policy.py): on a forced setting, on
a device where the measured seconds decide, and llama.cpp's mixed call against two calls."""

import json
from dataclasses import replace

import numpy as np
import pytest

from swarmtune.engine.backends.backend import Caps, Landing
from swarmtune.engine.backends.sim_backend import SimBackend
from swarmtune.engine.conversation.sampling import SamplingParams
from swarmtune.engine.engine import Engine, EngineSettings
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.model.profiles import profile
from tests.conftest import SIM, run_cli


class DeviceSim(SimBackend):
    """The simulated card as a device: its launch returns before the step ends (unpaced, so the test runs at
    the host's speed); mixing is then measured by default."""

    @property
    def caps(self) -> Caps:
        return replace(super().caps, launches_async=True)


class SlowMix(DeviceSim):
    """A device where one call costs more than two (as on this CPU: 1.03-1.10x, bench/mixed_step.py)."""

    def launch_mixed(self, seqs: list[int], tokens: list[int], positions: list[int], prefill_seq: int,
                     prefill_tokens: list[int], pos0: int) -> Landing:
        chunk = self.prefill(prefill_seq, prefill_tokens, pos0)
        out, seconds = self._decode(seqs, tokens, positions)
        return lambda: (out, 1.2 * (seconds + chunk))


def run(backend: SimBackend, steps: int = 600, **kw) -> tuple[Engine, list]:
    e = Engine(backend, EngineSettings(agents=8, ctx_per_agent=4096, check=True, **kw))
    return e, [e.step() for _ in range(steps)]


def test_forced_mixing_carries_chunks_in_decode_steps_and_keeps_every_cache():
    e, recs = run(SimBackend(profile(SIM)), mix=True)  # the cache check runs after every step
    mixed = [r for r in recs if r.prefill_tokens]
    assert len(mixed) > 20 and all(r.kind == "decode" and r.batch >= 1 for r in mixed)
    assert all(r.batch + r.prefill_tokens <= e.backend.max_chunk_tokens for r in mixed)
    assert all(r.tokens == r.batch for r in mixed)  # prefill rows generate nothing
    # the chunks went in: every tool result was prefilled and its agent decoded on
    assert all(a.context > 0 for a in e.agents) and sum(r.tokens for r in recs if r.kind == "decode") > 3000
    # a mixed step teaches no fit: the decode fit's samples are plain steps only
    plain = [r for r in recs if r.kind == "decode" and not r.prefill_tokens]
    assert e.analysis.calibration(e.s.kv).fit is not None and len(plain) > 100


def test_on_a_device_it_mixes_where_the_measured_seconds_say_it_pays():
    e, recs = run(DeviceSim(profile(SIM)))
    policy = e.runner.mix
    assert policy.measuring and policy.pays()
    # the simulated card hides a chunk under the step's weight stream: one call beats the two calls' fits
    assert max(policy.ratios) < 1
    late = [r for r in recs[300:] if r.kind == "prefill" or r.prefill_tokens]
    assert late and sum(1 for r in late if r.prefill_tokens) >= 0.8 * len(late)


def test_on_a_device_where_one_call_loses_it_tries_less_and_less_often():
    e, recs = run(SlowMix(profile(SIM)), steps=1500)
    policy = e.runner.mix
    assert policy.measuring and not policy.pays() and min(policy.ratios) > 1
    tries = [r.step for r in recs if r.prefill_tokens]
    chunks = [r.step for r in recs if r.kind == "prefill"]
    assert 3 <= len(tries) <= 12 and len(chunks) > 10 * len(tries)
    gaps = np.diff(tries)
    assert gaps[-1] > gaps[0]


def test_the_cpu_keeps_two_calls_unless_told():
    _, auto = run(SimBackend(profile(SIM)), steps=300)
    _, off = run(DeviceSim(profile(SIM)), steps=300, mix=False)
    assert not any(r.prefill_tokens for r in auto + off)


def test_mix_flag_on_the_command_line(tmp_path):
    out = run_cli("record", "--sim", SIM, "--steps", "200", "--mix", "on", "-o", str(tmp_path / "r.jsonl"))
    assert out.returncode == 0, out.stderr
    steps = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()[1:]]
    assert any(r["prefill_tokens"] for r in steps)
    bad = run_cli("record", "--sim", SIM, "--mix", "maybe", "-o", str(tmp_path / "x.jsonl"))
    assert bad.returncode == 2 and "--mix" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.model
def test_llama_one_call_computes_what_two_calls_compute(llama_backend):
    """Two sequences decode while a third's prompt is prefilled: in one llama_decode, the greedy tokens, the
    first token after the prompt and the logits each cache then gives are those of two calls."""
    b = llama_backend
    prompts = [b.text.tokenize(t) for t in ("def add(a, b):\n    return", "The capital of France is",
                                         "import numpy as np\n\nx = np.arange(10)\nprint(x.")]

    def start() -> tuple[list[int], list[int]]:
        b.open(KVSetting.parse("f16"), 3, 256)
        for s in range(3):
            b.steps.set_sampler(s, SamplingParams(temperature=0.0))
        firsts = []
        for s in (0, 1):
            b.steps.prefill(s, prompts[s], 0)
            firsts.append(b.steps.first_token_after_prefill(s))
        return firsts, [len(prompts[0]), len(prompts[1])]

    def after() -> list[np.ndarray]:
        return [b.steps.next_logits(s, 13, b.cells.span(s)[1] + 1) for s in range(3)]

    firsts, pos = start()
    two, _ = b.steps.launch_decode([0, 1], firsts, pos)()
    b.steps.prefill(2, prompts[2], 0)
    two_first, two_logits = b.steps.first_token_after_prefill(2), after()

    firsts, pos = start()
    one, _ = b.steps.launch_mixed([0, 1], firsts, pos, 2, prompts[2], 0)()
    one_first, one_logits = b.steps.first_token_after_prefill(2), after()

    assert (one, one_first) == (two, two_first)
    for x, y in zip(one_logits, two_logits, strict=True):
        assert int(np.argmax(x)) == int(np.argmax(y)) and float(np.max(np.abs(x - y))) < 0.05


@pytest.mark.model
def test_llama_engine_mixing_keeps_every_cache(llama_backend):
    """Tool results prefilled inside the others' decode steps on the real model, the cache check after every
    step, and the agents whose chunk finished in a mixed step go on from its first token."""
    e = Engine(llama_backend, EngineSettings(agents=4, ctx_per_agent=512, gen_tokens=16, tool_tokens=64,
                                             reference=False, check=True, mix=True))
    recs = [e.step() for _ in range(120)]
    mixed = [r for r in recs if r.prefill_tokens]
    assert mixed and all(r.kind == "decode" and r.tokens == r.batch for r in mixed)
    assert sum(r.tokens for r in recs if r.kind == "decode") > 150

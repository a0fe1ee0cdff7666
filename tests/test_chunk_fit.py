"""A prefill chunk's cost at the size it runs, c + d · p + n · (a + b · (p + n/2)), and the longest chunk within a
bound."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swarmtune.engine.backends.sim_backend import SimBackend
from swarmtune.engine.engine import Engine, EngineSettings
from swarmtune.engine.errors import UserError
from swarmtune.engine.measure.chunk_fit import ChunkFit, ChunkTimes
from swarmtune.engine.model.profiles import profile
from tests.conftest import SIM


def test_it_tells_a_calls_cost_from_a_tokens():
    """A GPU-like chunk (each call reads the weights once: c is most of a small chunk), a CPU-like one (c ~ 0),
    and one whose call reads its cached cells at a cost per cell (d: a 16-token chunk at 6k cells costs ten
    times one at 0, as this project's EPYC measured)."""
    for c, d, a, b in ((3e-3, 0.0, 2e-5, 1e-9), (0.0, 0.0, 3.7e-3, 1e-7), (0.0, 1e-4, 3.9e-3, 1.8e-6)):
        times = ChunkTimes()
        for n, pos in ((16, 0), (256, 16), (64, 272), (200, 336), (32, 536), (128, 568), (16, 4096), (256, 6144)):
            times.add(n, pos, c + d * pos + n * (a + b * (pos + n / 2)))
        fit = times.fit
        assert fit is not None
        assert fit.per_call_seconds == pytest.approx(c, abs=1e-9)
        assert fit.per_call_position_seconds == pytest.approx(d, abs=1e-10)
        assert fit.per_token_seconds == pytest.approx(a, rel=1e-6)
        assert fit.per_token_position_seconds == pytest.approx(b, rel=1e-4)


def test_too_few_chunks_are_no_fit():
    times = ChunkTimes()
    times.add(16, 0, 0.01)
    times.add(32, 16, 0.02)
    times.add(0, 0, 1.0)  # no tokens: not a sample
    assert times.fit is None


@given(st.floats(0.0, 0.05), st.floats(0.0, 1e-4), st.floats(1e-6, 1e-2), st.floats(0.0, 1e-6),
       st.integers(0, 100_000), st.floats(1e-4, 2.0), st.integers(1, 4096))
def test_the_chunk_within_a_bound_is_the_longest_that_fits(c, d, a, b, pos0, bound, most):
    fit = ChunkFit(c, d, a, b, 8)
    n = fit.tokens_within(bound, pos0, most)
    assert 0 <= n <= most
    if n:
        assert fit.seconds(n, pos0) <= bound * (1 + 1e-9)
    if n < most:
        assert fit.seconds(n + 1, pos0) > bound * (1 - 1e-9)


def run(bound: float | None, steps: int = 500, auto: bool = False) -> tuple[Engine, list]:
    e = Engine(SimBackend(profile(SIM)), EngineSettings(agents=8, ctx_per_agent=4096, check=True,
                                                        max_stall_s="auto" if auto else bound))
    return e, [e.step() for _ in range(steps)]


def test_a_stall_bound_cuts_the_chunks_that_run_between_decode_steps():
    """Tool results arrive while the others decode: with a bound no prefill step between two decode steps runs
    past it (the simulated card's chunk times are exact, so the fit is too), and none is cut for nothing."""
    _, free = run(None)
    e, bound = run(0.05)
    assert max(r.seconds for r in free if r.kind == "prefill") > 0.1  # whole chunks, unbounded
    steps = [r for r in bound if r.kind == "prefill"]
    cut = [r for r in steps if r.note.startswith("stall bound")]
    assert cut and all(r.seconds <= 0.05 * (1 + 1e-9) for r in steps if r.step > 20)  # past the probing chunks
    fit = e.analysis.chunks[e.s.kv].fit
    assert fit is not None
    # each cut chunk is the longest the fit allows (the card's prefill costs the same at every position)
    longest = fit.tokens_within(0.05, 0, 256)
    assert longest == int(0.05 * profile(SIM).prefill_tokens_per_s)
    assert all(r.tokens == longest for r in cut if r.step > 20)
    assert all(a.context > 0 for a in e.agents) and sum(r.tokens for r in bound if r.kind == "decode") > 1000


def test_the_auto_bound_is_a_few_of_the_swarms_measured_decode_steps():
    """--max-stall-ms auto: no chunk between two decode steps runs past STALL_DECODE_STEPS of the decode steps
    measured so far, and the record says the bound it held."""
    from swarmtune.engine.settings import STALL_DECODE_STEPS

    e, steps = run(None, steps=800, auto=True)
    cut = [r for r in steps if r.note.startswith("stall bound")]
    assert cut and all(r.note.endswith(" tokens") and " ms: " in r.note for r in cut)
    longest_decode = 0.0
    for r in steps:
        if r.kind == "decode" and not r.reference:
            longest_decode = max(longest_decode, r.seconds)
        elif r.kind == "prefill" and r.step > 20 and any(a.state == "decoding" for a in r.agents):
            assert r.seconds <= STALL_DECODE_STEPS * longest_decode * (1 + 1e-9)
    assert sum(r.tokens for r in steps if r.kind == "decode") > 1000


def test_a_bound_is_a_number_above_zero():
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(UserError, match="--max-stall-ms"):
            EngineSettings(max_stall_s=bad).validate(0)


def test_no_reference_step_while_a_prompt_fills():
    """A batch-1 reference step between two chunks would make the decoding agents wait through both: it waits
    for the prefill to end (up to the longest cadence)."""
    _, steps = run(None, steps=1500)
    refs = [i for i, r in enumerate(steps) if r.reference]
    assert refs  # the swarm still times its reference
    for i in refs:  # the agents as the step before it left them, when the step was chosen
        assert not any(a.pending for a in steps[i - 1].agents), steps[i].step

"""Timing a KV type in a side cache: the live cache (its cells, its next-token logits, its samplers) is
left as it was; the points it times are where it says; a type against itself scales a fit by about 1;
and the simulated side cache is as strict as the live one."""

import dataclasses

import numpy as np
import pytest

from swarmtune.engine.backends.backend import CacheMismatch
from swarmtune.engine.backends.sim_backend import SimBackend
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.measure.kv_probe import (
    RATIO_BOUNDS,
    SHORT_CONTEXT,
    STEPS,
    WARMUP,
    KvProbe,
    long_context,
    probe_kv,
    probe_kv_converted,
)
from swarmtune.engine.measure.step_model import Fit
from swarmtune.engine.model.profiles import profile
from tests.conftest import SIM, prefill_code

KV = KVSetting.parse  # a KV setting as a flag spells it


@pytest.mark.model
def test_a_probe_leaves_the_live_cache_its_logits_and_its_samplers_as_they_were(llama_backend):
    b = llama_backend
    tokens, nxt, cells_before, logits_before = prefill_code(b)
    samplers = dict(b.samplers.chains)  # the session's backend: other tests' samplers too

    p = probe_kv(b, KV("f16"), KV("q8_0"), 2, 256)

    assert (b.kv, b.n_seqs, b.cells.span(0), b.cells.span(1)) == (KV("f16"), 2, cells_before, (-1, -1))
    assert b.samplers.chains == samplers
    np.testing.assert_allclose(b.steps.next_logits(0, nxt, len(tokens)), logits_before, atol=1e-4)
    # what it timed: each type's history in chunks at their positions, then three decode points
    for kv in (KV("f16"), KV("q8_0")):
        assert [(n, pos) for n, pos, _ in p.prefill[kv]] == [(128, 0), (128, 128)]
        mid = WARMUP + (STEPS + 1) / 2  # the timed steps' mean context past the history
        assert [(bb, c) for bb, c, _ in p.decode[kv]] == [(1, SHORT_CONTEXT + mid), (2, SHORT_CONTEXT + mid),
                                                          (2, 256 + mid)]
        assert all(s > 0 for *_, s in p.decode[kv] + p.prefill[kv])
    fixed, per_token = p.ratios
    assert 0.2 < fixed < 5 and 0.05 < per_token < 20
    assert p.wall_s > 0 and p.record()["source"] == "measured in a side cache"


@pytest.mark.model
def test_a_history_converted_to_another_type_restores_into_a_side_cache_of_that_type(llama_backend):
    """A side cache reads llama.cpp's rotation for its own type: a state converted from the live f16 cache to
    q8_0 (rotated) restores there, and the live cache is as it was after."""
    b = llama_backend
    tokens, nxt, cells_before, logits_before = prefill_code(b)
    saved, _, _ = b.cells.save_seq(0)
    converted, _ = b.cells.convert_saved(saved, KV("q8_0"))
    with b.side_cache(KV("q8_0"), 2, 512):
        b.cells.restore_seq(0, converted)
        assert b.cells.span(0) == cells_before and b.kv == KV("q8_0")
        with pytest.raises(CacheMismatch):
            b.cells.restore_seq(1, saved)  # an f16 state is not a q8_0 cache's
    assert b.kv == KV("f16") and b.cells.span(0) == cells_before
    np.testing.assert_allclose(b.steps.next_logits(0, nxt, len(tokens)), logits_before, atol=1e-4)


@pytest.mark.model
def test_a_probe_on_a_converted_history_prefills_nothing_and_leaves_the_live_cache_as_it_was(llama_backend):
    """The live cache's sequence 0, converted into each type's side cache and cut to the long point: the same
    decode points as a prefilled probe's, no prefill, and the live cache (cells, logits) as it was."""
    b = llama_backend
    tokens, nxt, cells_before, logits_before = prefill_code(b)

    p = probe_kv_converted(b, KV("f16"), KV("q8_0"), 2, 0, 90)  # of its 96 tokens

    assert (b.kv, b.n_seqs, b.cells.span(0), b.cells.span(1)) == (KV("f16"), 2, cells_before, (-1, -1))
    np.testing.assert_allclose(b.steps.next_logits(0, nxt, len(tokens)), logits_before, atol=1e-4)
    mid = WARMUP + (STEPS + 1) / 2
    for kv in (KV("f16"), KV("q8_0")):
        assert [(bb, c) for bb, c, _ in p.decode[kv]] == [(1, SHORT_CONTEXT + mid), (2, SHORT_CONTEXT + mid),
                                                          (2, 90 + mid)]
        assert all(s > 0 for *_, s in p.decode[kv])
    assert p.prefill == {} and p.contexts == (SHORT_CONTEXT, 90)
    assert p.record()["history"] == "converted" and p.wall_s > 0


@pytest.mark.model
def test_a_type_probed_against_itself_scales_a_fit_by_about_one(llama_backend):
    """The same type twice: the two lines differ by the machine's noise only (a shared 2-core box: a wide bound)."""
    llama_backend.open(KV("f16"), 1, 256)
    p = probe_kv(llama_backend, KV("f16"), KV("f16"), 4, 256)
    fixed, per_token = p.ratios
    assert 0.6 < fixed < 1.6 and 0.33 < per_token < 3.0


def _probe(base: tuple[float, float], other: tuple[float, float]) -> KvProbe:
    return KvProbe("q8_0", "f16", 8, (64, 512), {"f16": [(8, 68.0, base[0]), (8, 516.0, base[1])],
                                                  "q8_0": [(8, 68.0, other[0]), (8, 516.0, other[1])]}, {}, 1.0)


def test_the_ratios_split_the_step_into_what_attention_reads_and_the_rest():
    # base: 30 ms + 0.1 ms per context token; other: the same 30 ms, a third of the attention
    p = _probe((0.030 + 0.1e-3 * 64, 0.030 + 0.1e-3 * 512), (0.030 + 0.1e-3 / 3 * 64, 0.030 + 0.1e-3 / 3 * 512))
    fixed, per_token = p.ratios
    assert fixed == pytest.approx(1.0) and per_token == pytest.approx(1 / 3)
    fit = Fit(((1, 0.01), (8, 0.03)), 1e-5, 0.01, 100, 0.02, 50, 2e-6)
    scaled = p.scale(fit)
    assert [b for b, _ in scaled.knots] == [1, 8] and [g for _, g in scaled.knots] == pytest.approx([0.01, 0.03])
    assert scaled.per_kv_token_seconds == pytest.approx(1e-5 / 3)
    assert scaled.per_longest_token_seconds == pytest.approx(2e-6 / 3)
    assert scaled.median_error is None and scaled.samples == 0  # not checked at its own type yet


def test_attention_too_small_to_time_gives_one_ratio_for_the_whole_step():
    p = _probe((0.030, 0.0301), (0.020, 0.0201))  # attention under a tenth of the step: its slope is noise
    fixed, per_token = p.ratios
    assert fixed == per_token == pytest.approx(0.0201 / 0.0301)


def test_a_probes_step_error_grows_with_its_steps_spread_and_past_its_long_point():
    # lines as in the split test above: q8_0's step over f16's at 512 tokens is what the ratios forecast
    base, other = (0.030 + 0.1e-3 * 64, 0.030 + 0.1e-3 * 512), (0.030 + 0.1e-3 / 3 * 64, 0.030 + 0.1e-3 / 3 * 512)
    p = _probe(base, other)
    assert p.step_error(512) == pytest.approx(0.0, abs=1e-9)  # no spread kept: the points taken as exact
    noisy = dataclasses.replace(p, spread={"f16": [0.001, 0.001], "q8_0": [0.001, 0.001]})
    at_long = noisy.step_error(512)
    # each point 1 ms either way: at the long point q8_0's 47.1 ms over f16's 81.2 ms lies in 46.1/82.2..48.1/80.2
    used = other[1] / base[1]
    assert at_long == pytest.approx(max((other[1] + 0.001) / (base[1] - 0.001) / used - 1,
                                        1 - (other[1] - 0.001) / (base[1] + 0.001) / used))
    # past the long point the lines are extrapolated: the same spreads say less and less of a longer history
    assert at_long < noisy.step_error(2048) < noisy.step_error(8192)


def test_an_unsplit_probe_is_off_by_what_its_whole_step_ratio_leaves_out_at_longer_contexts():
    # attention too small to time apart at 64-512 tokens: one ratio for the whole step; the lines' own ratio
    # at 8,192 tokens differs from it, and a forecast there may be off by that much
    p = _probe((0.030, 0.0310), (0.020, 0.0215))
    assert not p.split
    assert p.step_error(512) == pytest.approx(0.0, abs=1e-9)
    assert p.step_error(8192) > 0.05


def test_the_long_point_follows_the_swarm_within_its_bounds():
    assert long_context(0, 2048) == 256
    assert long_context(300, 2048) == 600
    assert long_context(5000, 2048) == 1024
    assert long_context(5000, 300) == 300 - STEPS - WARMUP - 8  # room for the timed steps


def test_the_simulated_side_cache_is_as_strict_as_the_live_one_and_leaves_it_as_it_was():
    b = SimBackend(profile(SIM))
    b.open(KV("f16"), 2, 512)
    b.steps.seed_sampler(0, 3)
    b.steps.prefill(0, b.text.tokenize("x" * 400), 0)
    live = dict(b._len)
    with b.side_cache(KV("q8_0"), 4, 300):
        assert b.kv == KV("q8_0") and b.cells.span(0) == (-1, -1)
        with pytest.raises(CacheMismatch):  # a token past the side cache's own history, as llama.cpp refuses
            b.steps.launch_decode([0], [1], [100])()
        b.steps.prefill(0, b.text.tokenize("y" * 40), 0)
    assert (b.kv, b.n_seqs, b._len) == (KV("f16"), 2, live)
    b.steps.launch_decode([0], [1], [live[0]])()  # the live sequence goes on where it was


def test_a_ratio_past_what_a_cache_type_can_do_is_noise_and_is_clamped():
    # the probed type's attention slope barely positive: a per-token ratio of 0.01 is a slope of medians' noise
    p = _probe((0.030 + 0.1e-3 * 64, 0.030 + 0.1e-3 * 512), (0.030 + 1e-6 * 64, 0.030 + 1e-6 * 512))
    assert p.split and p.ratios[1] == RATIO_BOUNDS[0]

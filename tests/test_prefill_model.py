"""The prefill-time model: n · (a + b · (p + n/2)) per chunk, both costs >= 0, fitted on relative error."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swarmtune.engine.measure.prefill_model import PrefillCalibration


def test_it_recovers_a_cost_that_grows_with_the_history():
    cal = PrefillCalibration()
    a, b = 2.7e-3, 3.1e-6  # q8_0 on this CPU, per token and per token per cached position
    for pos in range(0, 2048, 256):
        cal.add(256, pos, 256 * (a + b * (pos + 128)))
    assert cal.fit is not None
    assert cal.fit.per_token_seconds == pytest.approx(a, rel=1e-6)
    assert cal.fit.per_token_position_seconds == pytest.approx(b, rel=1e-6)
    assert cal.fit.seconds(192, 1000) == pytest.approx(192 * (a + b * 1096))


def test_chunks_at_one_position_cannot_tell_the_costs_apart_so_all_is_per_token():
    cal = PrefillCalibration()
    cal.add(128, 0, 0.4)
    cal.add(128, 0, 0.4)
    assert cal.fit is not None and cal.fit.per_token_position_seconds == 0.0
    assert cal.fit.seconds(128, 0) == pytest.approx(0.4)


def test_nothing_measured_is_no_fit_and_a_bad_chunk_is_not_learned():
    cal = PrefillCalibration()
    cal.add(0, 0, 1.0)
    cal.add(10, 0, 0.0)
    assert cal.fit is None


@given(st.lists(st.tuples(st.integers(1, 256), st.integers(0, 4096), st.floats(1e-4, 10.0)), min_size=1, max_size=40))
def test_costs_are_never_negative_whatever_the_noise(chunks):
    cal = PrefillCalibration()
    for n, pos, sec in chunks:
        cal.add(n, pos, sec, pinned=len(chunks) % 2 == 0)
    assert cal.fit is not None
    assert cal.fit.per_token_seconds > 0 and cal.fit.per_token_position_seconds >= 0

"""The calibrated step-time model: piecewise in the batch, never falling with it, its error prequential."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from swarmtune.engine.measure.step_model import MAX_KNOTS, Calibration, Fit


def _line_fit_error(points: list[tuple[int, float, float]]) -> float:
    """The worst relative error of the best a + b·B + c·N through the points (least squares)."""
    import numpy as np

    a = np.array(points, dtype=float)
    x = np.column_stack([np.ones(len(a)), a[:, 0], a[:, 1]]) / a[:, 2:3]
    coef, *_ = np.linalg.lstsq(x, np.ones(len(a)), rcond=None)
    return float(np.max(np.abs(x @ coef - 1)))


def test_a_batch_cost_that_saturates_is_fitted_where_a_line_cannot_be():
    # the shape measured on one 2-core CPU: batch 2 costs twice batch 1, batch 8 only 4.5 times
    shape = {1: 1.0, 2: 2.0, 4: 3.0, 8: 4.5}
    points = [(b, b * ctx, 0.01 * m + 2e-6 * b * ctx) for b, m in shape.items() for ctx in (64, 512, 2048)]
    cal = Calibration()
    for p in points:
        cal.add(*p, pinned=True)
    fit = cal.refit()
    assert fit is not None
    assert fit.rms_relative_error < 1e-6
    assert _line_fit_error(points) > 0.05
    for b, ctx, s in points:
        assert abs(fit.step_seconds(b, ctx) / s - 1) < 1e-6
    assert abs(fit.speedup(8, 512) - 8 * (0.01 + 2e-6 * 512) / (0.045 + 2e-6 * 8 * 512)) < 1e-6
    # between knots it is the straight line between them
    assert abs(fit.batch_seconds(3) - 0.025) < 1e-9


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 64), st.integers(0, 40_000), st.floats(1e-4, 1.0)), min_size=3, max_size=80))
def test_any_samples_give_costs_that_never_fall_and_are_never_negative(samples):
    cal = Calibration()
    for b, n, s in samples:
        cal.add(b, n, s)
    fit = cal.refit()
    if fit is None:
        return
    assert fit.per_kv_token_seconds >= 0
    assert len(fit.knots) <= MAX_KNOTS
    gs = [fit.batch_seconds(b) for b in range(1, 129)]
    assert all(g >= 0 for g in gs)
    assert all(later >= earlier - 1e-12 for earlier, later in zip(gs, gs[1:], strict=False))


def test_extrapolation_past_the_knots_follows_a_doubling_not_the_last_noisy_segment():
    fit = Fit(((1, 0.010), (2, 0.016), (4, 0.022), (7, 0.040), (8, 0.040)), 0.0, 0.0, 0)
    # 4 -> 8 is the segment that spans a doubling: slope 0.0045 per sequence
    assert abs(fit.batch_seconds(16) - (0.040 + 8 * 0.0045)) < 1e-9
    assert fit.batch_seconds(16) > fit.batch_seconds(8)


def test_its_stated_error_is_of_steps_it_had_not_yet_seen():
    cal = Calibration()
    for b in (1, 2, 4, 8):
        cal.add(b, 100.0 * b, 0.01 + 0.002 * b + 1e-6 * 100 * b)
    assert cal.median_error is None or cal.median_error == 0  # nothing was predicted before the first fit
    fit = cal.refit()
    assert fit is not None and fit.median_error is None
    cal.add(4, 400.0, 2 * fit.step_seconds(4, 400.0))  # a step twice as slow as predicted
    assert cal.median_error is not None and abs(cal.median_error - 0.5) < 1e-9
    refit = cal.refit()
    assert refit.median_error == cal.median_error and refit.checked == 1


def test_a_record_round_trips_and_an_older_recording_still_reads():
    fit = Fit(((1, 0.01), (8, 0.03)), 2e-6, 0.04, 100, 0.021, 50)
    back = Fit.from_record(json.loads(json.dumps(fit.record)))
    assert back == fit
    old = Fit.from_record([0.008, 0.004, 7e-6, 0.029])  # a recording from before: a + b·B + c·N
    assert old is not None
    for b in (1, 3, 8, 16):
        assert abs(old.step_seconds(b, 1000) - (0.008 + 0.004 * b + 7e-6 * 1000)) < 1e-12
    assert Fit.from_record({"knots": "nonsense"}) is None
    assert Fit.from_record([1.0]) is None


def test_a_real_run_states_the_median_error_of_its_step_time_predictions(fresh):
    """The default model, 4 agents: each decode record carries the fit with its prequential error."""
    from swarmtune.engine.engine import Engine
    from swarmtune.engine.settings import EngineSettings

    eng = Engine(fresh, EngineSettings(agents=4, batch_cap=4, gen_tokens=24, ctx_per_agent=512))
    fits = []
    for _ in range(120):
        rec = eng.step()
        if rec.kind == "decode" and rec.fit:
            fits.append(Fit.from_record(rec.fit))
    assert fits and fits[-1] is not None
    last = fits[-1]
    assert last.checked > 0 and last.median_error is not None
    # a model that predicts steps it has not seen: its error is finite and not wildly off on this machine
    assert 0 <= last.median_error < 0.5


def test_a_fit_knows_where_it_was_timed_and_where_it_extrapolates():
    """The dashboard draws the calibrated curve apart past the contexts and batch sizes its steps ran at."""
    from swarmtune.engine.measure.step_model import Calibration, Fit

    cal = Calibration()
    for b in (1, 4, 8):
        for ctx in (100.0, 300.0, 500.0):
            cal.add(b, b * ctx, 0.01 + 0.001 * b + 1e-6 * b * ctx, longest=ctx)
    fit = cal.refit()
    assert fit is not None and fit.timed_tokens == (100.0, 500.0)
    assert fit.timed_at(8, 300.0) and fit.timed_at(4, 100.0)
    assert not fit.timed_at(8, 2000.0) and not fit.timed_at(8, 50.0)
    assert not fit.timed_at(16, 300.0)  # a batch past the knots
    # it survives the record, and a record from before it says nothing was timed
    again = Fit.from_record(fit.record)
    assert again is not None and again.timed_tokens == fit.timed_tokens
    old = dict(fit.record)
    old.pop("timed_tokens")
    assert not Fit.from_record(old).timed_at(8, 300.0)
    assert fit.scaled(2.0).timed_tokens == fit.timed_tokens

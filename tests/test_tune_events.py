"""The tuner's records are dataclasses that serialise to the JSON recordings have always held, and read back."""

import json

import pytest

from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.record.records import StepRecord, step_from_dict
from swarmtune.engine.tune.events import (
    Confirmed,
    Decision,
    Experimented,
    Held,
    Outcome,
    Probed,
    Reverted,
    RevertRefused,
    Setting,
    Spent,
    Trial,
    event_from_json,
)

KV = KVSetting.parse  # a KV setting as a flag spells it

A, B = Setting(8, KV("f16"), "keep"), Setting(8, KV("q8_0"), "keep")
EVENTS = [
    Decision(from_=A, to=B, objective="tokens_per_s", predicted_gain=0.12, predicted_gain_source="modeled",
             trial=False, forecast_spread=0.01, horizon_s=68.0, mean_context=310.5, forecast_error=0.05,
             forecast_error_source="prior", kv_step_time_source=None, why="tune: kv f16 -> q8_0"),
    Outcome(from_=A, to=B, objective="tokens_per_s", predicted_gain=0.12, span_s=60.0, predicted_gain_span=0.1,
            forecast_spread=None, measured_gain=-0.03, stated_error=1.5, agrees=None, verdict="inconclusive",
            measured_gain_source="measured", stated_error_source="2 x rms", forecast_error=0.2, why="tune outcome"),
    Held(to=B, q=1.01, measured_gain=0.002, why="tune check: holds"),
    Confirmed(to=B, q=0.9, trial=True, measured_gain=0.3, why="tune check: holds"),
    Reverted(from_=B, to=A, measured_gain=-0.2, mean_context=400.0, source="measured steps", why="back",
             q=1.43, q_stderr=0.1, decode_steps=8, trial=False),
    Reverted(from_=B, to=A, measured_gain=-0.2, mean_context=400.0, source="objective", why="back", stated_error=0.1),
    RevertRefused(to=A, why="tune check: no"),
    Probed(kv=KV("q8_0"), base_kv=KV("f16"), why="timed", figures={"batch": 4, "probe_seconds": 2.2}),
    Probed(kv=KV("q8_0"), base_kv=KV("f16"), why="could not", error="no slot"),
    Trial(from_=A, to=B, objective="tokens_per_s", forecast_gain=0.2, forecast_gain_source="modeled",
          forecast_error=0.05, forecast_error_source="prior", exploratory=False, block_s=1.0, max_pairs=8, bar=0.01,
          mean_context=300.0, why="tune trial"),
    Experimented(from_=A, to=B, objective="tokens_per_s", result="rejected", pairs=3, objective_gain=-0.1,
                 objective_low=-0.5, objective_high=0.4, decode_factor=1.2, decode_factor_low=1.1,
                 decode_factor_high=1.3, prefill_factor=1.0, corrected_gain=-0.08, corrected_low=-0.1,
                 corrected_high=-0.05, confidence=0.95, forecast_gain=0.2, verdict="disagrees", seconds_incumbent=3.0,
                 seconds_candidate=3.0, switches=3, switch_s=0.9, switch_cells=6000, tokens_lost=40.0,
                 source="measured", why="tune experiment"),
    Spent(think_s=0.5, think_cpu_s=0.5, forecasts=20, looks=3, looks_skipped=0, probe_s=0.0, switches=4, switch_s=1.2,
          switch_cells=8000, experiments=1, experiment_s=12.0, tokens_lost=40.0, why="tuner spent"),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: e.phase)
def test_each_event_reads_back_from_its_json(event):
    d = json.loads(json.dumps(event.to_json()))
    assert d["phase"] == event.phase and d["why"] == event.why
    assert event_from_json(d) == event


def test_the_json_keeps_todays_keys():
    # what recordings made before the events were dataclasses hold: "from" and "to" as dicts, keys present
    d = EVENTS[0].to_json()
    assert d["from"] == {"batch_cap": 8, "kv": "f16", "residency": "keep"} and "kv_step_time_source" not in d
    assert "stated_error" not in EVENTS[4].to_json() and "q" not in EVENTS[5].to_json()
    assert EVENTS[7].to_json() == {"phase": "probed", "kv": "q8_0", "base_kv": "f16", "batch": 4,
                                   "probe_seconds": 2.2, "why": "timed"}


def test_a_tune_record_round_trips_through_a_recording_line():
    rec = StepRecord(step=3, t=1.5, kind="tune", batch=0, batch_ids=[], batch_cap=8, kv_type="f16", agents=[],
                     weight_bytes=0, kv_bytes=0.0, seconds=0.0, tokens=0, source="measured", note="x", tune=EVENTS[0])
    back = step_from_dict(json.loads(rec.to_json()))
    assert back.tune == EVENTS[0] and back.to_json() == rec.to_json()


def test_an_unknown_phase_is_refused():
    with pytest.raises(ValueError, match="unknown tune phase"):
        event_from_json({"phase": "guessed", "why": ""})


def test_an_older_recordings_decision_without_todays_keys_still_reads():
    old = {"phase": "decided", "from": A.as_dict(), "to": B.as_dict(), "objective": "tokens_per_s",
           "predicted_gain": 0.2, "why": "tune: kv f16 -> q8_0"}
    e = event_from_json(old)
    assert isinstance(e, Decision) and e.to == B and e.trial is None and e.why == old["why"]


def test_the_dashboard_shows_what_the_tuner_tries_and_what_it_spent():
    from swarmtune.tui.stats import Stats

    def rec(t: float, event) -> StepRecord:
        return StepRecord(step=0, t=t, kind="tune", batch=0, batch_ids=[], batch_cap=8, kv_type="f16", agents=[],
                          weight_bytes=0, kv_bytes=0.0, seconds=0.0, tokens=0, source="measured", note=event.why,
                          tune=event)

    st = Stats()
    st.add(rec(5.0, EVENTS[-3]))
    assert st.tuner_trying == "KV q8_0"
    st.add(rec(20.0, EVENTS[-2]))
    st.add(rec(20.0, EVENTS[-1]))
    assert st.tuner_trying == "" and st.tuner_spent_s == pytest.approx(1.7) and st.tuner_spent_at_s == 20.0

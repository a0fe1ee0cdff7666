"""The tuner's records are dataclasses that serialise to the JSON recordings have always held, and read back."""

import json

import pytest

from swarmtune.engine.records import StepRecord, step_from_dict
from swarmtune.engine.tune_events import (
    Confirmed,
    Decision,
    Held,
    Outcome,
    Probed,
    Reverted,
    RevertRefused,
    Setting,
    event_from_json,
)

A, B = Setting(8, "f16", "keep"), Setting(8, "q8_0", "keep")
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
    Probed(kv="q8_0", base_kv="f16", why="timed", figures={"batch": 4, "probe_seconds": 2.2}),
    Probed(kv="q8_0", base_kv="f16", why="could not", error="no slot"),
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

"""The engine's Python face: a Control is read or refused at the call, in one line, field by field, and the
engine runs on. Before, `Control(kv="q8_0")` passed the call and failed later on the engine's thread."""

import pytest

from swarmtune.engine.control import Control, parse_command
from swarmtune.engine.errors import UserError
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.settings import DraftSetting

BAD = [
    ("kv", 8, "kv must be a KV setting"),
    ("kv", "q9_9", "unknown KV type"),
    ("kv", "", "a KV setting is a type"),
    ("batch_cap", "4", "batch cap must be a whole number"),
    ("batch_cap", 2.5, "batch cap must be a whole number"),
    ("batch_cap", True, "batch cap must be a whole number"),
    ("agents", "8", "agents must be a whole number"),
    ("agents", 3.0, "agents must be a whole number"),
    ("residency", 1, "residency must be one of keep, swap, drop"),
    ("autotune", "yes", "autotune must be true or false"),
    ("autotune", 1, "autotune must be true or false"),
    ("draft", 17, "draft length must be between 0 and 16"),
    ("draft", -1, "draft length must be between 0 and 16"),
    ("draft", "often", "draft must be a whole number or auto"),
    ("draft", True, "draft must be a whole number or auto"),
    ("draft", 2.5, "draft must be a whole number or auto"),
]


@pytest.mark.parametrize(("name", "value", "says"), BAD)
def test_a_bad_field_is_refused_at_the_call_in_one_line_and_the_engine_runs_on(sim_engine, name, value, says):
    sim_engine.step()
    before = sim_engine.state()
    with pytest.raises(UserError, match=says) as err:
        sim_engine.request(Control(**{name: value}))
    assert "\n" not in str(err.value) and err.value.field in (name, "kv_type", "draft")
    assert sim_engine.state() == before
    assert sim_engine.step().kind in ("decode", "prefill", "rebuild")


def test_a_kv_setting_may_be_given_by_its_spelling(sim_engine):
    assert Control(kv="q8_0/f16").kv == KVSetting.parse("q8_0/f16")
    sim_engine.request(Control(kv="q8_0"))
    r = sim_engine.step()
    assert r.kind == "rebuild" and r.kv_type == "q8_0" and sim_engine.s.kv == KVSetting.parse("q8_0")


@pytest.mark.parametrize(("name", "value"), [("batch_cap", 2), ("agents", 3), ("residency", "swap"),
                                             ("kv", KVSetting.parse("q4_0")), ("draft", DraftSetting(4)),
                                             ("draft", DraftSetting(8, auto=True))])
def test_a_good_field_of_each_kind_is_taken(sim_engine, name, value):
    state = sim_engine.request(Control(**{name: value}))
    got = state.kv if name == "kv" else getattr(state, name)
    assert got == value


def test_a_draft_setting_may_be_given_as_a_number_or_auto():
    assert Control(draft=4).draft == DraftSetting(4) and Control(draft="4").draft == DraftSetting(4)
    assert Control(draft="auto").draft == DraftSetting(8, auto=True)
    assert parse_command("draft auto") == Control(draft=DraftSetting(8, auto=True))
    assert Control(draft="auto").to_http() == {"draft": "auto"} and Control(draft=3).to_http() == {"draft": 3}
    assert Control.from_http({"draft": 3}) == Control(draft=DraftSetting(3))
    with pytest.raises(UserError, match="draft length must be between 0 and 16"):
        parse_command("draft 99")

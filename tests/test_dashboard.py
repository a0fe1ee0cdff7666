"""Pilot tests of the dashboard's controls on the sim backend, and one on the real default model."""

import time

import pytest

from swarmtune.engine.backends.sim_backend import SimBackend
from swarmtune.engine.engine import Engine, EngineSettings
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.measure.power.meter import ModeledMeter
from swarmtune.engine.model.profiles import profile
from swarmtune.sources.live import LiveSource
from swarmtune.tui.app import SwarmApp
from tests.conftest import SIM, wait_for

KV = KVSetting.parse  # a KV setting as a flag spells it


def sim_app(kv_convert: bool = True) -> SwarmApp:
    p = profile(SIM)
    e = Engine(SimBackend(p), EngineSettings(ctx_per_agent=16384, kv_budget_bytes=p.kv_budget_bytes,
                                             kv_convert=kv_convert),
               meter=ModeledMeter(p.power_floor_watts, p.power_per_agent_watts))
    return SwarmApp(LiveSource(e))


async def test_controls_on_the_sim_backend():
    app = sim_app()
    async with app.run_test(size=(160, 50)) as pilot:
        assert await wait_for(pilot, lambda: app.stats.latest_decode is not None)
        assert app.mode == "SIMULATED"
        await pilot.press("k")
        assert await wait_for(pilot, lambda: app.stats.latest.kv_type == "q8_0")
        await pilot.press("K")  # the KV selector
        from textual.widgets import OptionList
        n = app.stats.steps
        assert await wait_for(pilot, lambda: app.stats.steps > n)  # the panels keep repainting behind the picker
        assert not app._panel_errors
        ol = app.screen.query_one(OptionList)
        ol.highlighted = [o.id for o in ol.options].index("q4_0")
        await pilot.press("enter")
        assert await wait_for(pilot, lambda: app.stats.latest.kv_type == "q4_0")
        await pilot.press("minus")
        assert await wait_for(pilot, lambda: app.stats.latest.batch_cap == 7)
        await pilot.press("plus")
        assert await wait_for(pilot, lambda: app.stats.latest.batch_cap == 8)
        await pilot.press("a")
        assert await wait_for(pilot, lambda: len(app.stats.latest.agents) == 9)
        await pilot.press("x")
        assert await wait_for(pilot, lambda: len(app.stats.latest.agents) == 8)
        await pilot.press("d")  # drafts: 0 -> 4
        assert await wait_for(pilot, lambda: app.stats.latest.draft_setting == "4")
        assert any("drafts 4" in note.message for note in app._notifications)
        await pilot.press("space")
        assert app.paused
        n = app.stats.steps
        await pilot.pause(0.5)  # a negative check: nothing may arrive for a while
        assert app.stats.steps <= n + 12  # at most what was already in flight
        await pilot.press("space")
        await pilot.press("r")
        assert app.stats.steps < 20
        await pilot.press("question_mark")
        assert any("cycle KV" in note.message for note in app._notifications)
        await pilot.press("q")


async def test_typed_values_and_refusals():
    app = sim_app()
    async with app.run_test(size=(80, 24)) as pilot:
        assert await wait_for(pilot, lambda: app.stats.latest_decode is not None)
        await pilot.press("colon")
        for ch in "cap 3":
            await pilot.press("space" if ch == " " else ch)
        await pilot.press("enter")
        assert await wait_for(pilot, lambda: app.stats.latest.batch_cap == 3)
        await pilot.press("colon", *"kv", "space", *"fp8", "enter")
        assert await wait_for(pilot, lambda: any("unknown KV type" in n.message for n in app._notifications))
        await pilot.press("colon", *"cap", "space", *"99", "enter")
        assert await wait_for(pilot, lambda: any("batch cap must be between 1 and 8 (got 99)" in n.message
                                                 for n in app._notifications))
        await pilot.press("colon", *"cap", "space", *"x", "enter")
        assert await wait_for(pilot, lambda: any("cap needs a whole number" in n.message for n in app._notifications))
        assert app.engine.state().batch_cap == 3 and app.engine.state().kv == KV("f16")
        for _ in range(5):
            await pilot.press("minus")
        assert await wait_for(pilot, lambda: any("(got 0)" in n.message for n in app._notifications))
        assert app.engine.state().batch_cap == 1  # refused below 1, left at 1


@pytest.mark.model
async def test_dashboard_on_the_default_model(llama_backend):
    e = Engine(llama_backend,
               EngineSettings(agents=3, ctx_per_agent=512, gen_tokens=16, tool_tokens=64, reference=False))
    app = SwarmApp(LiveSource(e))
    async with app.run_test(size=(120, 40)) as pilot:
        assert await wait_for(pilot, lambda: app.stats.latest_decode is not None, timeout=60)
        assert app.mode == ""  # measured, not simulated
        await pilot.press("minus")
        assert await wait_for(pilot, lambda: app.stats.latest.batch_cap == 2, timeout=30)
        assert any(a.tail.strip() for a in app.stats.latest.agents)
        assert app.stop_engine()


async def test_a_kv_switch_shows_its_rebuild_progress():
    from swarmtune.tui.messages import EngineProgress

    app = sim_app(kv_convert=False)  # the re-prefill path reports its progress chunk by chunk
    seen: list = []
    async with app.run_test(size=(120, 40), message_hook=seen.append) as pilot:
        assert await wait_for(pilot, lambda: app.stats.latest_decode is not None)
        await pilot.press("k")
        assert await wait_for(pilot, lambda: app.stats.latest.kv_type == "q8_0")
        rebuild = [m for m in seen if isinstance(m, EngineProgress) and m.what == "rebuild"]
        assert rebuild and rebuild[-1].done == rebuild[-1].total > 0
        assert "f16 -> q8_0" in app.stats.rebuild_note
        assert app.stop_engine()


async def _quit_seconds(app: SwarmApp, pilot) -> float:
    """Press q; seconds until the source's worker is out of the engine (what the exit waits for)."""
    t0 = time.perf_counter()
    await pilot.press("q")
    assert app.engine_stopped.wait(10)
    seconds = time.perf_counter() - t0
    print(f"quit took {seconds:.3f} s")
    return seconds


async def test_quit_just_after_a_kv_switch_is_prompt():
    app = sim_app(kv_convert=False)  # the sim plays a rebuild's re-prefill seconds at wall-clock pace
    async with app.run_test(size=(120, 40)) as pilot:
        assert await wait_for(pilot, lambda: app.stats.latest_decode is not None)
        await pilot.press("k")
        assert await wait_for(pilot, lambda: app.stats.rebuild_note != "")
        assert await _quit_seconds(app, pilot) < 0.5


@pytest.mark.model
async def test_quit_mid_rebuild_on_the_real_model(llama_backend):
    e = Engine(llama_backend, EngineSettings(agents=4, ctx_per_agent=2048, gen_tokens=16, tool_tokens=192,
                                             reference=False, kv_convert=False))
    app = SwarmApp(LiveSource(e))
    async with app.run_test(size=(120, 40)) as pilot:
        assert await wait_for(pilot, lambda: app.stats.latest is not None and
                              sum(a.context for a in app.stats.latest.agents) > 3000, timeout=120)
        await pilot.press("k")
        # the re-prefill of ~3,000 tokens runs chunk by chunk: quit in the middle of it
        assert await wait_for(pilot, lambda: app.query_one("#rebuild").has_class("active"), timeout=30)
        assert await _quit_seconds(app, pilot) < 0.5


@pytest.mark.slow
async def test_tuner_and_residency_controls_and_its_decisions_on_screen():
    from swarmtune.engine.tune.goal import Goal
    from swarmtune.engine.tune.tuner import Tuner

    p = profile(SIM)
    s = EngineSettings(agents=8, ctx_per_agent=p.context_per_agent, kv_budget_bytes=p.kv_budget_bytes, seed=1,
                       gen_tokens=256, tool_tokens=1024, tool_latency_s=5.0)
    e = Engine(SimBackend(p), s, tuner=Tuner(Goal(allowed_kv=(KV("f16"), KV("q8_0")), forecast_seeds=1)),
               autotune=True)
    app = SwarmApp(LiveSource(e))
    async with app.run_test(size=(160, 50)) as pilot:
        # its first look comes at once on the sim: the switch to q8_0 is a line on screen
        assert await wait_for(pilot, lambda: any(n.title == "tuner" for n in app._notifications), timeout=30)
        assert await wait_for(pilot, lambda: app.stats.tuner_on, timeout=5)
        await pilot.press("t")
        assert await wait_for(pilot, lambda: app.engine.state().autotune is False)
        await pilot.press("colon", *"residency", "space", *"swap", "enter")
        assert await wait_for(pilot, lambda: app.engine.s.residency == "swap")
        await pilot.press("colon", *"autotune", "space", *"maybe", "enter")
        assert await wait_for(pilot, lambda: any("autotune takes on or off" in n.message for n in app._notifications))
        await pilot.press("colon", *"residency", "space", *"far", "enter")
        assert await wait_for(pilot, lambda: any("residency must be one of" in n.message for n in app._notifications))
        assert app.engine.s.residency == "swap"
        await pilot.press("t")
        assert await wait_for(pilot, lambda: app.engine.state().autotune is True)
        await pilot.press("q")


async def test_t_on_an_engine_without_a_tuner_says_so():
    app = sim_app()
    async with app.run_test(size=(120, 40)) as pilot:
        assert await wait_for(pilot, lambda: app.stats.latest is not None)
        await pilot.press("t")
        assert await wait_for(pilot, lambda: any("no tuner" in n.message for n in app._notifications))
        await pilot.press("q")


async def test_the_dashboard_serves_clients_and_shows_each_conversation_as_an_agent():
    """`swarmtune run --clients`: one process, the dashboard and the OpenAI API on one engine (sim)."""
    import httpx

    from swarmtune.engine.agents.served import ServedAgents
    from swarmtune.server.hosted import HostedSource
    from swarmtune.server.runner import EngineRunner

    p = profile(SIM)
    backend = SimBackend(p)
    served = ServedAgents(backend)
    e = Engine(backend, EngineSettings(agents=3, ctx_per_agent=4096), agents=served)
    source = HostedSource(EngineRunner(e, served=served), served, "127.0.0.1", 0, None)
    app = SwarmApp(source)
    async with app.run_test(size=(160, 50)) as pilot:
        assert await wait_for(pilot, lambda: source.server.started and "127.0.0.1:0" not in source.status, 60)
        url = source.status.split()[1]
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            r = await http.post("/chat/completions", json={"messages": [{"role": "user", "content": "hi " * 40}],
                                                           "max_tokens": 8, "user": "reviewer"})
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8
        # its row: its key, and (once the paced sim's records catch up) waiting for its client
        assert await wait_for(pilot, lambda: app.stats.latest is not None and any(
            a.label == "reviewer" and a.state == "client" for a in app.stats.latest.agents), 60)
        # a new conversation is a miss: the panel under the agents appears and says so
        assert await wait_for(pilot, lambda: app.query_one("#misses").display)
        assert [m for *_, m in app.stats.misses][-1].startswith("new at 0: ")
        await pilot.press("k")  # the dashboard's controls reach the served engine
        assert await wait_for(pilot, lambda: app.stats.latest.kv_type == "q8_0")
        await pilot.press("q")


async def test_speculation_shown_counted_and_curved():
    """With drafts on: the status line counts drafted against kept and the tokens an agent gains a step, and
    the speedup plot carries the curve with speculation beside the one without, and the verify steps' points."""
    from swarmtune.tui.widgets.plots import SpeedupPlot
    from swarmtune.tui.widgets.status import status_text

    p = profile(SIM)
    e = Engine(SimBackend(p), EngineSettings(ctx_per_agent=p.context_per_agent, kv_budget_bytes=p.kv_budget_bytes,
                                             draft_tokens=4))
    app = SwarmApp(LiveSource(e))
    async with app.run_test(size=(160, 50)) as pilot:
        assert await wait_for(pilot, lambda: app.stats.accepted > 20 and len(app.stats.spec_points) > 3)
        s = app.stats
        assert s.drafted >= s.accepted and s.draft_gain is not None and s.draft_gain > 0
        line = status_text(s, "", False).plain
        assert f"drafts kept {s.accepted:,}/{s.drafted:,}" in line and "tok/agent-step" in line
        await pilot.pause(2.5)  # the plot repaints every 2 s
        labels = [x.label for x in app.query_one(SpeedupPlot).chart.series]
        assert any(lb.startswith("with speculation") for lb in labels), labels
        assert any("drafts verified" in lb for lb in labels), labels


def test_a_prompt_being_prefilled_shows_how_far_and_the_time_left():
    from swarmtune.engine.record.records import AgentView
    from swarmtune.tui.stats import Stats
    from swarmtune.tui.widgets.agents import progress

    s = Stats()
    for _ in range(3):  # prefill steps of 256 tokens in 0.5 s: 512 tokens/s
        s.prefills.append((256, 0.5))
    a = AgentView(1, 1200, "prefilling", 16384, 0, 0, "", pending=15184)
    assert s.prefill_tokens_per_s == 512
    assert progress(a, s.prefill_tokens_per_s).plain == "⏳1,200/16,384 ~30 s │ "
    assert progress(AgentView(2, 900, "decoding", 16384, 5, 1, ""), 512.0).plain == ""


def _step(t: float, views: list, kind: str = "decode", note: str = "", ended: list | None = None):
    from swarmtune.engine.record.records import StepRecord

    return StepRecord(step=int(t * 100), t=t, kind=kind, batch=len(views), batch_ids=[v.id for v in views],
                      batch_cap=8, kv_type="f16", agents=views, weight_bytes=0, kv_bytes=0.0, seconds=0.0,
                      tokens=0, source="simulated", note=note, ended=ended or [])


def test_inter_token_gaps_are_per_token_and_a_turns_first_token_has_none():
    from swarmtune.engine.record.records import AgentView
    from swarmtune.tui.latency import Latencies, percentile

    lat = Latencies()
    v = lambda gen, turns, state="decoding": AgentView(0, 100 + gen, state, 4096, gen, turns, "")  # noqa: E731
    lat.add(_step(1.0, [v(1, 0, "prefilling")]))  # the turn's first token: no gap before it
    lat.add(_step(1.1, [v(2, 0)]))  # 100 ms
    lat.add(_step(1.2, [v(2, 0)]))  # no token for it (a prefill held it back)
    lat.add(_step(1.5, [v(4, 0)]))  # two tokens (a kept draft) 400 ms after its last: two gaps of 200
    lat.add(_step(1.6, [v(5, 1, "tool")]))  # its turn's last token: a gap of 100, the turn ends at it
    lat.add(_step(9.0, [v(6, 1, "prefilling")]))  # the next turn's first token, after the tool: none
    lat.add(_step(9.05, [v(7, 1)]))  # 50 ms
    assert [round(g, 6) for g in lat.gaps_s] == [0.1, 0.2, 0.2, 0.1, 0.05]
    assert lat.agent_itl_s(0) == pytest.approx(0.13)
    assert percentile([3, 1, 2, 4], 50) == 2 and percentile([3, 1, 2, 4], 99) == 4 and percentile([], 50) is None
    assert [round(g, 6) for g in lat.gap_percentiles()] == [0.1, 0.2, 0.2]


def test_the_latency_panel_shows_the_swarms_percentiles_and_a_held_prefill():
    from swarmtune.engine.record.records import AgentView, RequestLatency
    from swarmtune.tui.stats import Stats
    from swarmtune.tui.widgets.agents import waited
    from swarmtune.tui.widgets.latency import latency_text

    s = Stats()
    done = [RequestLatency(f"r{i}", 0, 0.01 * i, 0.25, 0.25 + 0.01 * i, 0.05, 0.09, 1.0, 16) for i in range(1, 101)]
    s.add(_step(1.0, [AgentView(0, 10, "decoding", 4096, 1, 0, "", queue_s=0.5)], ended=done))
    s.add(_step(1.04, [AgentView(0, 11, "decoding", 4096, 2, 0, "", queue_s=0.5, ttft_s=0.7)]))
    s.add(_step(1.5, [AgentView(0, 11, "decoding", 4096, 2, 0, "", queue_s=0.5, ttft_s=0.7)], kind="prefill",
                note="stall bound 300 ms: 48 of 2000 tokens"))
    shown = latency_text(s)
    assert shown is not None
    text = shown.plain
    assert "inter-token 40 ms / 40 ms / 40 ms" in text
    assert "queue 500 ms / 950 ms / 990 ms" in text and "prefill 250 ms / 250 ms / 250 ms" in text
    assert "TTFT 750 ms / 1.2 s / 1.2 s" in text
    assert "stall bound 300 ms: 48 of 2000 tokens a step" in text
    assert waited(s.latest.agents[0], s.latency.agent_itl_s(0)).plain == "q 500ms ttft 700ms itl 40ms │ "


async def test_the_screen_is_drawn_before_the_engine_is_built_and_early_keys_apply_after():
    """`swarmtune run` draws every panel from the model file's header and the flags while the engine is built on
    the source's thread (bench/first_screen.py times it at the terminal); a key pressed meanwhile applies once
    the engine comes."""
    import threading

    from swarmtune.cli import build_parser
    from swarmtune.factories import make_engine, preview
    from swarmtune.tui.widgets.agents import AgentsTable

    args = build_parser().parse_args(["run", "--sim", SIM, "--agents", "4"])
    go = threading.Event()

    def build():
        assert go.wait(30)
        return make_engine(args)

    app = SwarmApp(LiveSource.later(build, preview(args)))
    async with app.run_test(size=(160, 50)) as pilot:
        assert await wait_for(pilot, lambda: app.stats.latest is not None and app.stats.latest.note == "starting")
        assert app.engine is None and len(app.stats.latest.agents) == 4
        await pilot.pause()
        rows = app.screen.query_one(AgentsTable)._agents
        assert [a.state for a in rows] == ["starting"] * 4
        await pilot.press("minus")  # cap 4 -> 3, before the engine exists
        assert app.source.state().batch_cap == 3
        go.set()
        assert await wait_for(pilot, lambda: app.stats.latest_decode is not None and app.stats.steps > 0
                              and app.stats.latest.batch_cap == 3, timeout=30)
        assert not app._panel_errors
        assert app.stop_engine()


def test_the_budget_forecast_says_where_and_when_the_kv_budget_fills():
    """Issue 54's marker: the context per agent at which the resident histories fill the KV budget at the
    setting in force (the byte model's, exactly the engine's figure), and when at the measured growth; made
    early, it names a time within a quarter of when the swarm first has to preempt (the sim is seeded: 29.9 s
    forecast, 29.0 s found)."""
    from swarmtune.tui.stats import Stats

    p = profile(SIM)
    backend = SimBackend(p)
    k = backend.facts.kv_bytes_per_token(KV("f16"))
    e = Engine(backend, EngineSettings(agents=8, ctx_per_agent=16384, seed=3, gen_tokens=256, tool_tokens=512,
                                       kv_budget_bytes=8 * 3000 * k, check=False))
    stats, early = Stats(), None
    stats.set_header(e.header())
    for _ in range(20000):
        r = e.step()
        stats.add(r)
        if early is None and r.t > 20:
            early = (r.t, stats.budget.forecast(stats.header, stats.latest))
        if r.preempted:
            break
    assert r.preempted, "the budget never bound"
    t0, f = early
    assert f is not None and f.budget_tokens == e.budget_tokens(e.s.kv)
    assert f.full_at_context == pytest.approx(f.budget_tokens / 8)
    assert f.growth_tokens_per_s is not None and f.growth_tokens_per_s > 0
    bound_after = r.t - t0
    assert 0.75 * bound_after <= f.seconds_left <= 1.33 * bound_after, (f.seconds_left, bound_after)
    assert "budget full at" in f.text()

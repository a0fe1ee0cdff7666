"""Speculation: drafts from the agents' own text (engine/spec/), verified in the batched decode step; the
rejected drafts' cells removed; the output, under greedy sampling, the same tokens as without."""

import json
from collections import defaultdict
from dataclasses import dataclass, field

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from swarmtune.engine.agents.agent import Agent
from swarmtune.engine.backends.llama_steps import LlamaSteps
from swarmtune.engine.backends.sim_backend import SimBackend
from swarmtune.engine.batch_runner import BatchRunner
from swarmtune.engine.control import Control
from swarmtune.engine.conversation.sampling import SamplingParams
from swarmtune.engine.engine import Engine, EngineSettings
from swarmtune.engine.errors import UserError
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.model.profiles import profile
from swarmtune.engine.settings import DraftSetting
from swarmtune.engine.spec.ngram_drafter import NgramDrafter
from tests.conftest import SIM, run_cli


@dataclass
class Run:
    streams: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))  # each agent's tokens, in order
    drafted: int = 0
    accepted: int = 0


def greedy(self: LlamaSteps, seq: int, seed: int) -> None:
    """Every agent draws its most likely token: a reply that speculation must not change."""
    self.live.samplers.set(seq, SamplingParams(temperature=0.0, seed=seed))


def greedy_run(model_path, kv: str, draft: int, steps: int, monkeypatch, draft_model: str | None = None) -> Run:
    out = Run()
    goes_on = BatchRunner.goes_on

    ended: set[int] = set()

    def seen(self: BatchRunner, a: Agent, tok: int) -> bool:
        # each agent's first turn: the synthetic swarm draws later turns' prompts and lengths in the order
        # turns end, which speculation changes
        if a.id not in ended:
            out.streams[a.id].append(tok)
        on = goes_on(self, a, tok)
        if not on:
            ended.add(a.id)
        return on

    with monkeypatch.context() as m:
        m.setattr(BatchRunner, "goes_on", seen)
        m.setattr(LlamaSteps, "seed_sampler", greedy)  # every context's steps
        return _run(out, model_path, kv, draft, steps, draft_model)


def _run(out: Run, model_path, kv: str, draft: int, steps: int, draft_model: str | None = None) -> Run:
    from swarmtune.engine.backends.llama_backend import LlamaBackend
    from swarmtune.engine.model.model_facts import read_model_facts

    b = LlamaBackend(read_model_facts(model_path), n_threads=2)
    # no batch-1 reference steps: they reorder the synthetic swarm's turns, and with them the prompts it draws
    e = Engine(b, EngineSettings(agents=3, batch_cap=3, kv=KVSetting.parse(kv), draft_tokens=draft, seed=1,
                                 gen_tokens=200, check=True, reference=False, draft_model=draft_model))
    try:
        for _ in range(steps):
            r = e.step()  # the cache check runs after every step: rejected cells are gone
            out.drafted += r.drafted
            out.accepted += r.accepted
            if r.kind == "decode":
                assert r.tokens == r.batch + r.accepted and r.accepted <= r.drafted
        if (m := e.runner.drafts.model) is not None:  # the draft model's cells are the tokens it says it holds
            import llama_cpp as ll

            assert m.held
            for seq, held in m.held.items():
                assert ll.llama_memory_seq_pos_max(m.mem, seq) + 1 == len(held)
                assert ll.llama_memory_seq_pos_min(m.mem, seq) == (0 if held else -1)
    finally:
        e.close()
    return out


@pytest.mark.model
@pytest.mark.parametrize("kv", ["f16", "q8_0", "q4_0", "q8_0/f16"])
def test_greedy_output_is_the_same_tokens_with_drafts(model_path, kv, monkeypatch):
    plain = greedy_run(model_path, kv, 0, 200, monkeypatch)
    spec = greedy_run(model_path, kv, 8, 120, monkeypatch)
    assert spec.drafted > 0 and spec.accepted > 0
    # as far as both runs went in each agent's first turn (the plain run is the slower)
    common = {a: min(len(t), len(spec.streams[a])) for a, t in plain.streams.items()}
    assert sum(common.values()) >= 240
    assert {a: spec.streams[a][:n] for a, n in common.items()} == {a: plain.streams[a][:n] for a, n in common.items()}


@pytest.mark.model
@pytest.mark.parametrize("kv", ["f16", "q8_0"])
def test_greedy_output_is_the_same_tokens_with_a_draft_model(model_path, kv, monkeypatch):
    # the model as its own draft model: its drafts are the greedy tokens themselves (but where the two
    # calls' shapes flip a near tie), so nearly every one is kept, and the output stays the plain run's
    plain = greedy_run(model_path, kv, 0, 200, monkeypatch)
    spec = greedy_run(model_path, kv, 4, 100, monkeypatch, draft_model=str(model_path))
    assert spec.drafted >= 40 and spec.accepted >= 0.8 * spec.drafted, (spec.drafted, spec.accepted)
    common = {a: min(len(t), len(spec.streams[a])) for a, t in plain.streams.items()}
    assert sum(common.values()) >= 240
    assert {a: spec.streams[a][:n] for a, n in common.items()} == {a: plain.streams[a][:n] for a, n in common.items()}


@pytest.mark.model
def test_a_draft_model_under_the_tuner(tmp_path, model_path):
    # the tuner's forecasts run shadows of the swarm on a simulator, which has no text to draft from: they
    # run without the draft model, and the run goes on with it
    out = run_cli("record", "--steps", "40", "--agents", "2", "--threads", "2", "--draft-model", str(model_path),
                  "--autotune", "tokens_per_s", "-o", str(tmp_path / "r.jsonl"))
    assert out.returncode == 0, out.stderr
    lines = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert lines[0]["settings"]["draft_model"] == str(model_path)
    assert any(x.get("kind") == "tune" for x in lines[1:])
    # the draft model's seconds are the swarm's (in the step's seconds) and said apart (not the fits')
    drafting = [x for x in lines[1:] if x.get("drafting_s")]
    assert drafting and all(0 < x["drafting_s"] < x["seconds"] for x in drafting)


@pytest.mark.model
def test_a_draft_cache_follows_a_new_agent_made_with_a_gone_ones_id_and_sequence(llama_backend, model_path):
    """The swarm shrunk and grown again makes a new agent with the id and sequence of one gone, its edits
    counted from 0 again: the draft model's cells of that sequence become the new agent's history, not the
    old one's cut to its length."""
    from swarmtune.engine.spec.model_drafter import ModelDrafter

    m = ModelDrafter(str(model_path), llama_backend.vocab, 2, on_device=False)
    try:
        old = Agent(id=3, seq=1, limit=512, history=list(range(100, 160)), next_token=7)
        m.draft_many([old], [2], 2, 512)
        assert m.held[1][:60] == old.history
        new = Agent(id=3, seq=1, limit=512, history=list(range(200, 270)), next_token=9)
        assert (new.id, new.seq, new.edits) == (old.id, old.seq, old.edits) and new.made != old.made
        m.draft_many([new], [2], 2, 512)
        assert m.held[1][:70] == new.history
    finally:
        m.close()


def test_a_draft_model_that_cannot_draft_is_one_line(tmp_path, model_path):
    import tests.tiny_gguf as tg

    other = tg.llama_dense(tmp_path / "other.gguf", tg.CHATML)  # a vocabulary of its own
    cases = [(("--draft-model", str(other)), "a draft model must share the model's"),
             (("--draft-model", str(tmp_path / "none.gguf")), "none.gguf: no such file"),
             (("--sim", SIM, "--draft-model", str(model_path)), "--draft-model needs a model run by llama.cpp")]
    for flags, said in cases:
        out = run_cli("record", "--steps", "5", "--agents", "2", "--threads", "2", *flags,
                      "-o", str(tmp_path / "r.jsonl"))
        assert out.returncode == 2, out.stderr
        assert said in out.stderr.strip().splitlines()[-1] and "Traceback" not in out.stderr
        assert not (tmp_path / "r.jsonl").exists()


def test_drafts_are_what_followed_the_newest_ngram():
    d = NgramDrafter()
    a = Agent(id=0, seq=0, limit=4096, history=[1, 2, 3, 4, 5, 6, 9, 9, 2, 3], next_token=4)
    assert d.draft(a, 3) == [5, 6, 9]  # "2 3 4" was followed by 5 6 9
    a.history += [4, 7, 6]
    a.next_token = 9
    assert d.draft(a, 2) == [9, 2]  # "7 6 9" unseen: the 2-gram "6 9" was followed by 9 2
    b = Agent(id=1, seq=1, limit=4096, history=[50, 51, 6, 9], next_token=9)
    assert d.draft(b, 2) == [2, 3]  # its own text has no "6 9 9": the pool has agent 0's
    assert d.draft(Agent(id=2, seq=2, limit=4096, history=[70], next_token=71), 4) == []


def test_a_run_that_reaches_the_end_of_the_history_goes_on_from_its_own_tokens():
    d = NgramDrafter()
    # text repeating itself: the newest "8 7 8" is followed by one token before the history ends
    a = Agent(id=0, seq=0, limit=4096, history=[7, 8, 7, 8, 7], next_token=8)
    assert d.draft(a, 6) == [7, 8, 7, 8, 7, 8]
    # "1 2 3" was last followed by "9 1 2", the history's end; "1 2" then, by "3" and what came after
    b = Agent(id=1, seq=1, limit=4096, history=[1, 2, 3, 9, 1, 2], next_token=3)
    assert d.draft(b, 6) == [9, 1, 2, 3, 9, 1]


def test_drafts_on_the_sim_keep_the_cache_and_count_what_they_earned():
    p = profile(SIM)
    e = Engine(SimBackend(p), EngineSettings(ctx_per_agent=p.context_per_agent, kv_budget_bytes=p.kv_budget_bytes,
                                             draft_tokens=4, check=True))
    recs = [e.step() for _ in range(400)]
    e.close()
    drafted = [r for r in recs if r.kind == "decode" and r.drafted]
    assert drafted and all(r.tokens == r.batch + r.accepted and 0 <= r.accepted <= r.drafted for r in drafted)
    assert not any(r.drafted for r in recs if r.reference)  # a reference step times batch 1 alone
    line = json.loads(drafted[0].to_json())
    assert line["drafted"] == drafted[0].drafted and line["accepted"] == drafted[0].accepted
    # each agent's view counts its own, as the dashboard shows them (the share it kept, before its text)
    views = recs[-1].agents
    assert sum(v.drafted for v in views) == sum(r.drafted for r in recs)
    assert sum(v.accepted for v in views) == sum(r.accepted for r in recs)
    from swarmtune.tui.widgets.agents import acceptance

    v = next(v for v in views if v.drafted)
    assert acceptance(v).plain == f"✓{v.accepted / v.drafted:.0%} "


def test_the_step_time_fits_learn_from_plain_steps_only():
    """A verify step computes more rows than it has agents: the step-time fits learn from plain steps, and a
    verify step's speedup counts the tokens its agents kept. (Until 2026-12-07 a record was annotated before
    it was told it verified drafts, and every verify step joined the fits as a plain one.)"""
    p = profile(SIM)
    e = Engine(SimBackend(p), EngineSettings(ctx_per_agent=p.context_per_agent, draft_tokens=4, check=False))
    recs = [e.step() for _ in range(300)]
    e.close()
    decodes = [r for r in recs if r.kind == "decode" and r.batch]
    verify = [r for r in decodes if r.drafted]
    plain = [r for r in decodes if not r.drafted and not r.reference]
    assert verify and plain
    assert all(r.fit is None and r.calibrated_speedup is None for r in verify)
    assert any(r.fit is not None for r in plain)
    assert e.analysis.calibration(e.s.kv).fit is not None
    rows = len(e.analysis.calibration(e.s.kv)._recent)
    assert rows == len([r for r in decodes if not r.drafted])  # plain steps and batch-1 references, no other
    timed = [r for r in verify if r.measured_speedup is not None]
    assert timed and all(r.measured_speedup > r.batch * 0.5 for r in timed)


def test_an_impossible_draft_length_is_one_line(tmp_path):
    out = run_cli("record", "--sim", SIM, "--steps", "5", "--draft", "17", "-o", str(tmp_path / "r.jsonl"))
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].endswith("draft length must be between 0 and 16 (got 17)")
    assert "Traceback" not in out.stderr and not (tmp_path / "r.jsonl").exists()


def test_the_draft_length_is_a_live_control():
    """Off, then 4 (the context made again with rows for them), then off (no rebuild), then auto (more rows:
    made again); each step's record says the setting it ran with, and the cache check holds throughout."""
    p = profile(SIM)
    e = Engine(SimBackend(p), EngineSettings(agents=4, ctx_per_agent=4096, check=True))
    before = [e.step() for _ in range(60)]
    assert not any(r.drafted for r in before) and {r.draft_setting for r in before} == {"0"}
    assert e.request(Control(draft=4)).draft == DraftSetting(4)
    assert e.step().kind == "rebuild"
    four = [e.step() for _ in range(300)]
    assert any(r.drafted for r in four) and {r.draft_setting for r in four} == {"4"}
    assert all(r.drafted <= 4 * r.batch for r in four)
    e.request(Control(draft=0))
    off = [e.step() for _ in range(60)]
    assert "rebuild" not in {r.kind for r in off} and not any(r.drafted for r in off[1:])
    e.request(Control(draft="auto"))
    assert e.step().kind == "rebuild" and e.state().draft == DraftSetting(8, auto=True)
    assert {e.step().draft_setting for _ in range(20)} == {"auto"}


def test_a_recurrent_model_refuses_drafts_and_keeps_none(tmp_path):
    import tests.tiny_gguf as tg
    from swarmtune.engine.backends.llama_backend import LlamaBackend
    from swarmtune.engine.model.model_facts import read_model_facts

    b = LlamaBackend(read_model_facts(tg.mamba(tmp_path / "mamba.gguf")), n_threads=2)
    try:
        with pytest.raises(UserError, match="recurrent state cannot take back"):
            Engine(b, EngineSettings(agents=2, draft_tokens=4, ctx_per_agent=512))
        assert b.draft_rows == 0
        e = Engine(b, EngineSettings(agents=2, ctx_per_agent=512))  # live, the same line and nothing changes
        with pytest.raises(UserError, match="recurrent state cannot take back") as err:
            e.request(Control(draft=4))
        assert err.value.field == "draft" and e.state().draft == DraftSetting(0) and b.draft_rows == 0
    finally:
        b.close()


def _chi2_fits(samples: list[int], p, alpha_z: float = 3.09) -> tuple[bool, str]:
    """Pearson's goodness of fit of draws to probabilities p, the rare tokens pooled (expected >= 5 each);
    accepted below the chi-square quantile at 1 - 0.001 (Wilson-Hilferty)."""
    import numpy as np

    n = len(samples)
    order = np.argsort(-p)
    cats: list[list[int]] = []
    mass = 0.0  # the last category's
    for t in order:  # most likely first: a category takes tokens until it expects 5 draws
        if cats and mass * n < 5:
            cats[-1].append(int(t))
            mass += p[t]
        else:
            cats.append([int(t)])
            mass = p[t]
    counts = np.bincount(np.array(samples), minlength=len(p))
    obs = np.array([counts[c].sum() for c in cats], dtype=float)
    exp = np.array([p[c].sum() * n for c in cats])
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    df = int(keep.sum()) - 1
    crit = df * (1 - 2 / (9 * df) + alpha_z * (2 / (9 * df)) ** 0.5) ** 3
    return stat < crit, f"chi2 {stat:.1f} on {df} df (critical {crit:.1f})"


@pytest.mark.model
@pytest.mark.parametrize("device_sampling", [True, False], ids=["device", "host"])
def test_sampled_drafts_keep_the_distribution(model_path, device_sampling):
    # temperature 1, nothing cut: the model's softmax is the distribution to keep. A prompt whose next token
    # is likely, a draft of that token: the first kept token must follow p(. | prompt, x), and the one after an
    # accepted draft p(. | prompt, x, draft)
    import numpy as np

    from swarmtune.engine.backends.llama_backend import LlamaBackend
    from swarmtune.engine.model.model_facts import read_model_facts

    b = LlamaBackend(read_model_facts(model_path), n_threads=2, device_sampling=device_sampling)
    try:
        b.allow_drafts(2)
        b.open(KVSetting.parse("f16"), 1, 128)
        prompt = b.text.tokenize("Count: 1, 2, 3, 4, 5, 6, 7, 8,")
        x = b.text.tokenize(" 9")[-1]

        def softmax(v: np.ndarray) -> np.ndarray:
            e = np.exp(v - v.max())
            return e / e.sum()

        b.steps.prefill(0, prompt, 0)
        p1 = softmax(b.steps.next_logits(0, x, len(prompt)).astype(np.float64))
        draft = int(np.argmax(p1))
        b.cells.drop(0)
        b.steps.prefill(0, [*prompt, x], 0)
        p2 = softmax(b.steps.next_logits(0, draft, len(prompt) + 1).astype(np.float64))
        firsts, seconds = [], []
        for seed in range(300):
            b.cells.drop(0)
            b.steps.set_sampler(0, SamplingParams(temperature=1.0, top_k=0, seed=seed))
            b.steps.prefill(0, prompt, 0)
            kept, _ = b.steps.launch_verify([0], [x], [len(prompt)], [[draft]])()
            firsts.append(kept[0][0])
            if kept[0][0] == draft:
                seconds.append(kept[0][1])
        ok1, why1 = _chi2_fits(firsts, p1)
        assert ok1, why1
        assert len(seconds) >= 60, f"the draft was accepted {len(seconds)} times of 300 (p {p1[draft]:.2f})"
        ok2, why2 = _chi2_fits(seconds, p2)
        assert ok2, why2
    finally:
        b.close()


@pytest.mark.model
def test_served_greedy_text_with_drafts_is_the_text_without(tmp_path):
    # what an agent sees: a client's greedy answer, streamed and not
    import openai

    from tests.remote_helpers import served

    code = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
    msgs = [{"role": "user", "content": f"Here is a file:\n{code}\nWrite it out again, unchanged."}]
    flags = ("--clients", "--agents", "4", "--ctx", "2048", "--threads", "2", "--check")

    def ask(url: str, stream: bool) -> str:
        c = openai.OpenAI(base_url=url + "/v1", api_key="anything")
        if not stream:
            return c.chat.completions.create(model="m", messages=msgs, max_tokens=48, temperature=0).choices[0]\
                .message.content or ""
        return "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
            model="m", messages=msgs, max_tokens=48, temperature=0, stream=True) if ch.choices)

    # each request against the same request on a server without drafts, in the same order: the second finds
    # the first's cells and prefills only the rest, whose logits differ from a whole prefill's in the last
    # bits, enough to flip a near tie with drafts or without (on a 2-core AVX-512 EPYC, 2026-12-07, the
    # second answer ended "return a" on both servers, the first "return a + b")
    with served(*flags) as s:
        want, want_streamed = ask(s.url, False), ask(s.url, True)
    rec = tmp_path / "r.jsonl"
    # alone on the server: other clients' rows change the step's shapes, and with them the last bits of the
    # logits, which can flip a near tie with or without drafts (the engine test covers drafts in a batch)
    with served(*flags, "--draft", "8", "--record", str(rec)) as s:
        got, streamed = ask(s.url, False), ask(s.url, True)
        metrics = {m.name: m.samples[0].value for m in text_string_to_metric_families(
            httpx.get(s.url + "/metrics").text) if "spec" in m.name}
    assert len(want) > 40 and got == want and streamed == want_streamed
    steps = [json.loads(x) for x in rec.read_text().splitlines()[1:] if '"type":"step"' in x]
    accepted = sum(st["accepted"] for st in steps)
    assert accepted > 0  # drafts were verified, and kept
    # each request's account: the two requests were this run's only ones, and all its drafting
    reqs = [json.loads(x) for x in rec.read_text().splitlines()[1:] if '"type":"request"' in x]
    assert len(reqs) == 2 and sum(q["accepted_draft_tokens"] for q in reqs) == accepted
    assert sum(q["draft_tokens"] for q in reqs) == sum(st["drafted"] for st in steps)
    # /metrics counts them as the records do, under vLLM's names and swarmtune's
    for prefix in ("vllm:spec_decode_", "swarmtune_spec_"):
        assert metrics[prefix + "num_accepted_tokens"] == accepted
        assert metrics[prefix + "num_draft_tokens"] == sum(st["drafted"] for st in steps)
        assert metrics[prefix + "num_drafts"] == sum(st["drafts"] for st in steps) > 0


@pytest.mark.model
def test_drafts_a_grammar_rejects_are_cut_before_the_step(llama_backend):
    """Under a grammar, the drafts past the first token it forbids never reach a row: the list is cut before
    llama_decode, and what is kept is what the grammar and the model agree on."""
    b = llama_backend
    b.open(KVSetting.parse("f16"), 1, 256)
    b.steps.set_sampler(0, SamplingParams(temperature=0.0, grammar='root ::= "The answer is " ("yes" | "no") "."'))
    prompt = b.text.tokenize(b.text.chat([{"role": "user", "content": "Is the sky blue? Answer yes or no."}], True))
    b.steps.prefill(0, prompt, 0)
    first = b.steps.first_token_after_prefill(0)
    assert b.text.piece(first) == "The"
    allowed, forbidden = b.text.tokenize(" answer is yes."), b.text.tokenize(" extra words")
    assert b.samplers.grammar_allows(0, allowed + forbidden) == len(allowed)
    drafts = [allowed + forbidden]
    kept, _ = b.steps.launch_verify([0], [first], [len(prompt)], drafts)()
    assert drafts == [allowed]  # cut in place: the caller counts the rows that ran
    assert b.cells.span(0) == (0, len(prompt) + len(allowed))  # no cell for a forbidden draft
    text = "The" + "".join(b.text.piece(t) for t in kept[0])
    assert text.startswith("The answer is ") and text.removeprefix("The answer is ") in ("y", "ye", "yes", "n", "no")


@pytest.mark.model
def test_served_greedy_json_with_drafts_is_the_json_without(tmp_path):
    """A JSON schema held by a grammar: the same answer with drafts as without."""
    import openai

    from tests.remote_helpers import served

    schema = {"type": "object", "properties": {"name": {"type": "string"}, "lines": {"type": "integer"}},
              "required": ["name", "lines"]}
    msgs = [{"role": "user", "content": 'Reply with this JSON and nothing else: {"name": "add_two_numbers", '
                                        '"lines": 2}. Again: {"name": "add_two_numbers", "lines": 2}'}]
    flags = ("--clients", "--agents", "2", "--ctx", "1024", "--threads", "2", "--check")

    def ask(url: str) -> str:
        c = openai.OpenAI(base_url=url + "/v1", api_key="anything")
        return c.chat.completions.create(
            model="m", messages=msgs, max_tokens=40, temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "f", "schema": schema}},
        ).choices[0].message.content or ""

    with served(*flags) as s:
        want = ask(s.url)
    rec = tmp_path / "r.jsonl"
    with served(*flags, "--draft", "8", "--record", str(rec)) as s:
        got = ask(s.url)
    assert json.loads(want) and got == want
    steps = [json.loads(x) for x in rec.read_text().splitlines()[1:] if '"type":"step"' in x]
    assert sum(st["drafted"] for st in steps) > 0  # drafts rode its steps, cut where the grammar ends them


def test_auto_drafts_where_a_row_is_cheap_and_not_where_it_costs_a_step():
    from swarmtune.engine.spec.draft_policy import EXPLORE_EVERY, EXPLORE_EVERY_MAX, DraftPolicy

    def settle(step_s: float, row_s: float, kept: float) -> DraftPolicy:
        p = DraftPolicy(8)
        for _ in range(4 * EXPLORE_EVERY):
            lengths = p.lengths([0, 1, 2, 3])
            drafted = sum(lengths)
            p.observed(4, step_s + drafted * row_s, drafted)
            for i, d in enumerate(lengths):
                p.verified(i, d, round(d * kept))
        return p

    # a compute-bound CPU step: a drafted row costs what an agent's row does (10 ms a row, 4 agents)
    cpu = settle(0.040, 0.010, 0.5)
    assert cpu.row_s == pytest.approx(0.010) and cpu.lengths([0, 1, 2, 3]) == [0, 0, 0, 0]
    # a GPU step bound by the weight stream: a row adds 1% of it
    gpu = settle(0.025, 0.00025, 0.7)
    assert all(d > 0 for d in gpu.lengths([0, 1, 2, 3]))
    # and now and then it measures again, whatever the rule says: less often where drafts did not pay
    assert cpu.explore_every > EXPLORE_EVERY and gpu.explore_every == EXPLORE_EVERY
    # where not even drafts all kept would pay (a row costs an agent's), at the longest interval at once;
    # where they would but these agents' do not, half as often each time
    assert cpu.explore_every == EXPLORE_EVERY_MAX
    unsure = settle(0.040, 0.004, 0.0)
    assert EXPLORE_EVERY < unsure.explore_every < EXPLORE_EVERY_MAX
    assert any(any(cpu.lengths([0, 1, 2, 3])) for _ in range(EXPLORE_EVERY_MAX))
    # between its measures, where not even drafts all kept would pay, no agent's draft is looked up
    gpu.explore_every = cpu.explore_every = 10**9
    assert gpu.could_pay(4) and not cpu.could_pay(4)


def test_auto_weighs_a_long_matchs_drafts_apart_from_a_short_ones():
    from swarmtune.engine.spec.draft_policy import EXPLORE_EVERY, DraftPolicy

    # a drafted row costs 0.6 of an agent's share of the step (this CPU's at 1,800 tokens of context): only
    # drafts nearly always kept pay. Agent 0's drafts stand on long matches, all kept; agent 1's on short
    # ones, none kept
    p = DraftPolicy(8)
    for _ in range(4 * EXPLORE_EVERY):
        lengths = p.lengths([0, 1], [2, 0])
        p.observed(2, 0.020 + sum(lengths) * 0.006, sum(lengths))
        p.verified(0, lengths[0], lengths[0])
        p.verified(1, lengths[1], 0)
    assert p.kept[(0, 2)] > 0.9 and p.kept[(1, 0)] < 0.1
    p.explore_every = 10**9  # the rule's own choices from here, no step drafting to measure
    assert p.lengths([0, 1], [2, 0]) == [8, 0]
    # the same agent, on a short match: what its long matches earned does not carry over
    assert p.lengths([0, 1], [0, 0]) == [0, 0]


def test_a_draft_says_how_long_a_match_it_stands_on():
    from swarmtune.engine.spec.ngram_drafter import MATCH_MAX, match_class

    d = NgramDrafter()
    text = list(range(100, 140))
    a = Agent(id=0, seq=0, limit=4096, history=[*text, 1, 2, *text[:-1]], next_token=text[-1])
    assert d.lookup(a, 3) == ([1, 2, 100], match_class(MATCH_MAX)) and match_class(MATCH_MAX) == 2
    b = Agent(id=1, seq=1, limit=4096, history=[7, 8, 9, 5, 1, 8], next_token=9)
    assert d.lookup(b, 2) == ([5, 1], 0)  # "8 9" alone agreed
    assert d.lookup(Agent(id=2, seq=2, limit=4096, history=[70], next_token=71), 4) == ([], 0)


def test_auto_on_the_sim_drafts_and_counts_like_a_fixed_length():
    p = profile(SIM)
    e = Engine(SimBackend(p), EngineSettings(ctx_per_agent=p.context_per_agent, kv_budget_bytes=p.kv_budget_bytes,
                                             draft_tokens=8, draft_auto=True, check=True))
    recs = [e.step() for _ in range(300)]
    e.close()
    dec = [r for r in recs if r.kind == "decode"]
    assert any(r.drafted for r in dec) and any(not r.drafted for r in dec)
    assert all(r.tokens == r.batch + r.accepted for r in dec)


def test_draft_auto_on_the_command_line(tmp_path):
    out = run_cli("record", "--sim", SIM, "--steps", "60", "--draft", "auto", "-o", str(tmp_path / "r.jsonl"))
    assert out.returncode == 0, out.stderr
    header = json.loads((tmp_path / "r.jsonl").read_text().splitlines()[0])
    assert header["settings"]["draft_tokens"] == 8 and header["settings"]["draft_auto"] is True
    bad = run_cli("record", "--sim", SIM, "--steps", "5", "--draft", "lots", "-o", str(tmp_path / "b.jsonl"))
    assert bad.returncode == 2 and "--draft must be a whole number or auto (got 'lots')" in bad.stderr


def test_the_flags_printed_for_other_engines_carry_the_speculation_held():
    import json as js

    from swarmtune.engine.model.bytes_model import ByteModel
    from swarmtune.engine.model.engine_flags import engine_flags

    bm = ByteModel.dense(1e9, 1024.0)
    plain = engine_flags(4, KVSetting.parse("f16"), "keep", 2048, bm, 1e9, None, None)
    assert not any("spec" in f for e in plain for f in e.flags)
    ll, vllm, zinc = engine_flags(4, KVSetting.parse("f16"), "keep", 2048, bm, 1e9, None, None, 6, True)
    assert ll.flags[ll.flags.index("--spec-type") + 1] == "ngram-simple"
    assert ll.flags[ll.flags.index("--spec-ngram-simple-size-m") + 1] == "6"
    assert any("measured length" in n for n in ll.notes)
    cfg = js.loads(vllm.flags[vllm.flags.index("--speculative-config") + 1])
    assert cfg == {"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_max": 3, "prompt_lookup_min": 2}
    assert any("speculation" in n for n in zinc.notes)


@pytest.mark.model
def test_drafts_a_lazy_call_grammar_rejects_are_cut_past_its_trigger(llama_backend):
    """tool_choice auto (issue 67): the call's grammar waits for the model to begin a call. Drafts before the
    trigger are free; past it, a draft is cut at the first token the call's grammar refuses (an unoffered
    tool), as issue 52's rule cuts them under a grammar held from the first token."""
    from swarmtune.engine.conversation.formats.hermes import Hermes

    read = {"type": "function", "function": {"name": "read_file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
    b = llama_backend
    b.open(KVSetting.parse("f16"), 1, 256)
    fmt = Hermes()
    b.steps.set_sampler(0, SamplingParams(temperature=0.0, grammar=fmt.call_grammar([read], False),
                                    grammar_triggers=fmt.triggers()))
    free = b.text.tokenize("Sure, let me look at {\"name\": \"rm_rf\"} first. ")
    call = b.text.tokenize('<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>')
    bad = b.text.tokenize('<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>')
    assert b.samplers.grammar_allows(0, free + call) == len(free + call)
    cut = b.samplers.grammar_allows(0, free + bad)
    assert len(free) < cut < len(free + bad)  # the trigger passed, the name it refuses cut
    kept = "".join(b.text.piece(t) for t in (free + bad)[:cut])
    assert kept.endswith('"name": "r') or kept.endswith('"name": "')

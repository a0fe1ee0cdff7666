"""KV quality: KL divergence of a setting's next-token distribution from an f16/f16 cache's, and the share of
top tokens kept, on llama-perplexity's windows; K and V apart; bad input is one line."""

import json
import math

import numpy as np
import pytest

from swarmtune.engine.errors import UserError
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.quality.kv_quality import LOG_P_FLOOR, MIN_POSITIONS, BandFigures, kl_and_top1, measure, windows
from tests.conftest import run_cli

KV = KVSetting.parse  # a KV setting as a flag spells it


def test_kl_is_the_reference_weighted_log_ratio_and_zero_against_itself():
    rng = np.random.default_rng(1)
    ref = rng.normal(size=(5, 50)).astype(np.float32)
    kl, same = kl_and_top1(ref, ref.copy())
    assert np.allclose(kl, 0.0, atol=1e-9) and same.all()
    test = ref + rng.normal(scale=0.3, size=ref.shape).astype(np.float32)
    kl, same = kl_and_top1(ref, test)
    p = np.exp(ref - ref.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    q = np.exp(test - test.max(1, keepdims=True))
    q /= q.sum(1, keepdims=True)
    assert np.allclose(kl, (p * np.log(p / q)).sum(1), rtol=1e-4) and (kl > 0).all()
    assert (same == (ref.argmax(1) == test.argmax(1))).all()
    # a reference probability below e^LOG_P_FLOOR adds nothing (as llama-perplexity leaves it out)
    tiny = np.array([[0.0, LOG_P_FLOOR - 10.0]], dtype=np.float32)
    kl, _ = kl_and_top1(tiny, np.array([[0.0, 5.0]], dtype=np.float32))
    p0 = 1 / (1 + math.exp(LOG_P_FLOOR - 10.0))
    assert kl[0] == pytest.approx(p0 * (math.log(p0) - (0.0 - math.log(1 + math.exp(5.0)))), rel=1e-6)


def test_windows_are_cut_as_llama_perplexity_cuts_them():
    toks = list(range(10, 35))
    assert list(windows(toks, 10, bos=None)) == [toks[0:10], toks[10:20]]  # the short tail is left out
    assert [w[0] for w in windows(toks, 10, bos=1)] == [1, 1]
    assert list(windows(toks, 10, bos=None, limit=1)) == [toks[0:10]]


def test_a_band_with_too_few_positions_says_so():
    f = BandFigures(KV("q8_0"), (256, 511))
    f.add(np.full(MIN_POSITIONS - 1, 0.01), np.ones(MIN_POSITIONS - 1, dtype=bool))
    f.close()
    assert f.mean_kl is None and "too few positions" in f.line() and "too few" in f.to_json()["source"]
    f.add(np.array([0.01]), np.array([False]))
    f.close()
    assert f.mean_kl == pytest.approx(0.01) and f.top1_same == pytest.approx(1 - 1 / MIN_POSITIONS)
    assert f.to_json()["source"] == "measured"


@pytest.mark.parametrize("text", ["q9_0", "q8_0/", "q8_0/f16/f16", "/f16", ""])
def test_an_unknown_or_malformed_kv_setting_is_one_user_error(text):
    with pytest.raises(UserError):
        KV(text)


def test_k_and_v_apart_and_one_spelling_for_both():
    assert KV("q8_0").label == "q8_0" and KV("q8_0/q8_0").label == "q8_0"
    p = KV("q8_0/f16")
    assert (p.k.name, p.v.name, p.label, p.quantized) == ("q8_0", "f16", "q8_0/f16", True)


def test_measured_on_the_default_model_f16_is_its_own_reference_and_k_and_v_differ(llama_backend):
    """The f16/f16 setting against the reference: nothing (the same cache computes the same logits). q4_0
    moves the distribution more than q8_0, and K and V apart are measured apart."""
    text = "def f(x):\n    return x + 1\n\n" * 20 + "class A:\n    def g(self, y):\n        return y * 2\n" * 20
    toks = llama_backend.text.tokenize(text)
    figs = measure(llama_backend, [toks], [KV("f16"), KV("q8_0"), KV("q4_0"), KV("q4_0/f16")], [256],
                   bos=llama_backend.text.bos_token(), max_windows=2)
    by = {f.setting.label: f for f in figs}
    assert all(f.band == (128, 255) and f.positions == 2 * 127 for f in figs)
    assert by["f16"].mean_kl == pytest.approx(0.0, abs=1e-6) and by["f16"].top1_same == 1.0
    assert 0 < by["q8_0"].mean_kl < by["q4_0"].mean_kl
    assert by["q4_0/f16"].mean_kl != by["q4_0"].mean_kl  # V at f16: another cache, another figure
    assert all(f.source == "measured" for f in figs)


@pytest.mark.model
def test_quality_command_prints_the_table_and_json(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("import os\nprint(os.getcwd())\n" * 300, encoding="utf-8")
    out = tmp_path / "q.json"
    r = run_cli("quality", "--text", str(text), "--kv", "q8_0,q8_0/f16", "--contexts", "128", "--windows", "2",
                "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "q8_0/f16" in r.stdout and "measured" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["reference"] == "f16/f16" and {f["setting"] for f in doc["figures"]} == {"q8_0", "q8_0/f16"}
    assert all(f["positions"] == 2 * 63 and f["mean_kl"] is not None for f in doc["figures"])


@pytest.mark.model
def test_quality_command_reads_a_transcript_of_conversations(tmp_path):
    conv = {"messages": [{"role": "system", "content": "You are terse."},
                         {"role": "user", "content": "Explain this code:\n" + "x = [i * i for i in range(10)]\n" * 30},
                         {"role": "assistant", "content": "It squares the numbers below ten, thirty times."}]}
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(conv) + "\n" + json.dumps(conv) + "\n", encoding="utf-8")
    r = run_cli("quality", "--transcript", str(path), "--kv", "q4_0", "--contexts", "128", "--json", "-")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert "2 conversations" in doc["on"] and doc["figures"][0]["positions"] > 0


@pytest.mark.parametrize("args, words", [
    (["--kv", "q9_0"], "unknown KV type"),
    (["--kv", "q8_0/"], "K/V types"),
    (["--contexts", "8"], "at least 16"),
    (["--text", "/nonexistent/file.txt"], "no such file"),
    (["--transcript", "BAD"], "not JSON"),
    (["--transcript", "NOMSG"], "each message is"),
    (["--sim", "rx9070xt-qwen3.5-9b"], None),
])
def test_quality_bad_input_is_one_line_and_exit_2(tmp_path, args, words):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n", encoding="utf-8")
    nomsg = tmp_path / "nomsg.jsonl"
    nomsg.write_text(json.dumps({"messages": [{"role": "robot", "content": "x"}]}) + "\n", encoding="utf-8")
    args = [str(bad) if a == "BAD" else str(nomsg) if a == "NOMSG" else a for a in args]
    r = run_cli("quality", *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) <= 2 and "Traceback" not in r.stderr  # argparse prints its usage line first
    if words:
        assert words in r.stderr


def test_a_served_turns_tokens_are_written_as_a_transcript_quality_reads(tmp_path):
    """serve --transcript: each served turn's exact tokens (its prompt, then what it generated), one JSON line,
    after the listener before it (the metrics'), which `swarmtune quality --transcript` reads as they are."""
    from swarmtune.engine.quality.quality_texts import conversation_documents, read_transcript
    from swarmtune.server.transcript import TranscriptWriter
    from tests.test_served import ask, make, run, toks

    e, served = make()
    seen = []
    served.on_finish = lambda req, rec: seen.append(rec.id)  # a listener installed before it
    path = tmp_path / "t.jsonl"
    w = TranscriptWriter(str(path))
    w.listen(served)
    prompt = toks(e, "system: you are an agent. user: fix the bug in parser.py please " * 3)
    r, c = ask(e, served, prompt)
    run(e, lambda: c.done is not None)
    w.close()
    [line] = [json.loads(x) for x in path.read_text().splitlines()]
    assert line["tokens"] == prompt + r.generated and len(r.generated) == 8 and seen == [line["id"]]
    convs = read_transcript(str(path))
    assert conversation_documents(e.backend, convs) == [prompt + r.generated]
    with pytest.raises(UserError):
        TranscriptWriter(str(tmp_path / "no" / "such" / "dir.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"tokens": [1, -2]}\n', encoding="utf-8")
    with pytest.raises(UserError, match="token ids"):
        read_transcript(str(bad))

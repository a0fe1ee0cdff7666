"""Sampling inside llama.cpp's graph (backend sampling): the tokens it draws against the host's.

Greedy draws are the host's, token for token, on every KV setting. A seeded draw is not the host's token
for the same seed (the device sums the probabilities in another order), so its distribution is tested
instead: thousands of draws from one position against the exact distribution the logits give."""

import math
from pathlib import Path

import numpy as np
import pytest

from swarmtune.engine.backends.llama_backend import LlamaBackend
from swarmtune.engine.conversation.sampling import SamplingParams
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.model.model_facts import read_model_facts
from tests import tiny_gguf

KV = KVSetting.parse

PROMPTS = ["Write a story about a cat.", "def fib(n):", "List three colours.", "The capital of France is"]


def generate(b: LlamaBackend, on_device: bool, kv: str, params: SamplingParams, steps: int = 24) -> list[list[int]]:
    """Each prompt in its own sequence, decoded together for `steps` steps."""
    b.samplers.device_sampling = on_device
    b.open(KV(kv), len(PROMPTS), 256)
    toks, pos, out = [], [], []
    for s, text in enumerate(PROMPTS):
        b.steps.set_sampler(s, params)
        p = b.text.tokenize(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")
        b.steps.prefill(s, p, 0)
        toks.append(b.steps.first_token_after_prefill(s))
        pos.append(len(p))
        out.append([toks[-1]])
    assert b.samplers.on_host(range(len(PROMPTS))) == ([] if on_device else list(range(len(PROMPTS))))
    seqs = list(range(len(PROMPTS)))
    for _ in range(steps):
        toks, _s = b.steps.launch_decode(seqs, toks, pos)()
        pos = [p + 1 for p in pos]
        for s in seqs:
            out[s].append(toks[s])
    return out


@pytest.mark.parametrize("kv", ["f16", "q8_0", "q4_0", "q8_0/f16"])
def test_greedy_tokens_on_the_device_are_the_hosts(llama_backend, kv):
    greedy = SamplingParams(temperature=0.0)
    try:
        host = generate(llama_backend, False, kv, greedy)
        device = generate(llama_backend, True, kv, greedy)
    finally:
        llama_backend.samplers.device_sampling = True
    assert device == host


def test_penalties_run_and_move_to_the_device(llama_backend):
    # the pinned bindings take the vocabulary's size first: a request with a penalty used to die in the engine
    p = SamplingParams(seed=3, presence_penalty=0.5, frequency_penalty=0.3, ignore_eos=True)
    out = generate(llama_backend, True, "f16", p, steps=8)
    assert all(len(o) == 9 for o in out)


def test_a_grammar_and_a_kept_row_fall_back_to_the_host(llama_backend):
    b = llama_backend
    b.open(KV("f16"), 3, 256)
    b.steps.set_sampler(0, SamplingParams(seed=1))
    b.steps.set_sampler(1, SamplingParams(seed=2, grammar='root ::= "yes" | "no"'))
    b.steps.set_sampler(2, SamplingParams(seed=3))
    assert b.samplers.on_host([0, 1, 2]) == [1]
    b.keep_logits(2, 4)  # the quality check reads seq 2's raw logits
    assert b.samplers.on_host([0, 1, 2]) == [1, 2]
    prompt = b.text.tokenize("Answer: ")
    firsts = []
    for s in range(3):
        b.steps.prefill(s, prompt, 0)
        firsts.append(b.steps.first_token_after_prefill(s))
    toks, _ = b.steps.launch_decode([0, 1, 2], firsts, [len(prompt)] * 3)()
    kept = b.watch.kept
    assert len(kept) == 1 and kept[0].logits.shape == (b.n_vocab,) and np.isfinite(kept[0].logits).any()
    said = b.text.piece(firsts[1]) + ("" if b.text.is_eog(toks[1]) else b.text.piece(toks[1]))
    assert said in ("yes", "no", "ye", "n", "y")  # the grammar held on the host
    b.keep_logits(None)
    assert b.samplers.on_host([0, 1, 2]) == [1]


def _chi2_critical(df: int, z: float = 3.29) -> float:
    """The chi-square quantile at about 1 - 5e-4 (Wilson-Hilferty): no scipy in the test extras."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def _expected(logits: np.ndarray, p: SamplingParams) -> np.ndarray:
    """The distribution llama.cpp's chain draws from, for top-k then temperature (top-p and min-p off)."""
    x = logits.astype(np.float64)
    if p.top_k > 0:
        cut = np.sort(x)[-p.top_k]
        x = np.where(x >= cut, x, -np.inf)
    x = x / p.temperature
    e = np.exp(x - x.max())
    return e / e.sum()


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0, top_k=0), SamplingParams(temperature=0.8)],
                         ids=["softmax", "top-k 40 at 0.8"])
def test_seeded_draws_on_the_device_follow_the_distribution(tmp_path: Path, params):
    b = LlamaBackend(read_model_facts(str(tiny_gguf.llama_device(tmp_path / "tiny.gguf"))), n_threads=1)
    try:
        n_seqs, rounds = 32, 48
        b.open(KV("f16"), n_seqs, 64)
        prompt = b.text.tokenize("hello, swarm")
        for s in range(n_seqs):
            b.steps.set_sampler(s, SamplingParams(**{**params.__dict__, "seed": 1000 + s}))
            b.steps.prefill(s, prompt[:-1], 0)
        assert b.samplers.on_host(range(n_seqs)) == []
        want = _expected(b.steps.next_logits(0, prompt[-1], len(prompt) - 1), params)
        counts = np.zeros(b.n_vocab)
        seqs = list(range(n_seqs))
        for _ in range(rounds):  # every sequence draws at the same position, again and again
            toks, _ = b.steps.launch_decode(seqs, [prompt[-1]] * n_seqs, [len(prompt) - 1] * n_seqs)()
            np.add.at(counts, toks, 1)
            for s in seqs:
                b.cells.truncate(s, len(prompt) - 1)
    finally:
        b.close()
    n = counts.sum()
    assert counts[want == 0].sum() == 0  # nothing the chain cuts is ever drawn
    exp = want * n
    big = exp >= 5  # Pearson's rule: the rare tokens pooled into one bin
    obs_b = np.append(counts[big], counts[~big].sum())
    exp_b = np.append(exp[big], exp[~big].sum())
    keep = exp_b > 0
    chi2 = float((((obs_b - exp_b) ** 2)[keep] / exp_b[keep]).sum())
    df = int(keep.sum()) - 1
    assert df >= 5, "the test position's distribution is too peaked to test"
    assert chi2 < _chi2_critical(df), f"chi2 {chi2:.1f} over {df} bins"


def test_a_chain_moves_with_its_sequence_to_a_rebuilt_cache(llama_backend):
    # llama.cpp sets a chain up for one graph (twice, it aborts): a rebuild's new context gets a clone
    b = llama_backend
    greedy = SamplingParams(temperature=0.0)
    b.open(KV("f16"), 2, 256)
    for s in range(2):
        b.steps.set_sampler(s, greedy)
    prompt = b.text.tokenize("The capital of France is")
    b.steps.prefill(0, prompt, 0)
    first = b.steps.first_token_after_prefill(0)
    for kv in ("q8_0", "f16"):  # the KV switch's rebuild, and back
        b.open(KV(kv), 2, 256)
        assert b.samplers.on_host([0, 1]) == []
        b.steps.prefill(0, prompt, 0)
        assert b.steps.first_token_after_prefill(0) == first


@pytest.mark.model
def test_host_sampling_is_a_flag_and_its_header_says_so(model_path):
    """Where each token is drawn is a flag, not an environment variable: --host-sampling draws every row on the
    host, and the run's settings say which."""
    from swarmtune.factories import make_backend
    from swarmtune.parsing import build_parser

    for flags, where in (([], "device"), (["--host-sampling"], "host")):
        args = ["record", "-o", "unused.jsonl", "--model", str(model_path), "--threads", "1", *flags]
        b = make_backend(build_parser().parse_args(args))
        try:
            assert b.info.settings["sampling"].startswith(where) and b.samplers.device_sampling is (where == "device")
        finally:
            b.close()

"""A decode step that carries a prefill chunk in the same call: llama.cpp's mixed call against two calls."""

import numpy as np
import pytest

from swarmtune.engine.conversation.sampling import SamplingParams
from swarmtune.engine.kv_types import KVSetting


@pytest.mark.model
def test_llama_one_call_computes_what_two_calls_compute(llama_backend):
    """Two sequences decode while a third's prompt is prefilled: in one llama_decode, the greedy tokens, the
    first token after the prompt and the logits each cache then gives are those of two calls."""
    b = llama_backend
    prompts = [b.tokenize(t) for t in ("def add(a, b):\n    return", "The capital of France is",
                                         "import numpy as np\n\nx = np.arange(10)\nprint(x.")]

    def start() -> tuple[list[int], list[int]]:
        b.open(KVSetting.parse("f16"), 3, 256)
        for s in range(3):
            b.set_sampler(s, SamplingParams(temperature=0.0))
        firsts = []
        for s in (0, 1):
            b.prefill(s, prompts[s], 0)
            firsts.append(b.first_token_after_prefill(s))
        return firsts, [len(prompts[0]), len(prompts[1])]

    def after() -> list[np.ndarray]:
        return [b.next_logits(s, 13, b.cells(s)[1] + 1) for s in range(3)]

    firsts, pos = start()
    two, _ = b.decode([0, 1], firsts, pos)
    b.prefill(2, prompts[2], 0)
    two_first, two_logits = b.first_token_after_prefill(2), after()

    firsts, pos = start()
    one, _ = b.launch_mixed([0, 1], firsts, pos, 2, prompts[2], 0)()
    one_first, one_logits = b.first_token_after_prefill(2), after()

    assert (one, one_first) == (two, two_first)
    for x, y in zip(one_logits, two_logits, strict=True):
        assert int(np.argmax(x)) == int(np.argmax(y)) and float(np.max(np.abs(x - y))) < 0.05

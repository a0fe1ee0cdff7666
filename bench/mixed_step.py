"""A prefill chunk and the decoding agents' tokens in one llama_decode (llama-server's way) against two
calls, a decode step and then a prefill step (swarmtune's way), on the default model.

For each context, it times the same work both ways, alternately, and prints the seconds per pair and
their ratio (one call over two); the last line is `ratio: X` at the middle context. Below 1.0 the single
call wins. Measured on this machine's CPU; a GPU's answer can differ (its prefill is not compute-bound
the same way).

    python bench/mixed_step.py [--batch 8] [--chunk 192] [--contexts 256,1024,1536] [--reps 12]
"""

import argparse
import statistics
import sys
import time

import llama_cpp as ll

from swarmtune.engine.backends.llama_backend import LlamaBackend
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.model.default_model import default_model_path
from swarmtune.engine.model.model_facts import read_model_facts

KV = KVSetting.parse  # a KV setting as a flag spells it


def fill(b: LlamaBackend, rows: list[tuple[int, int, int, bool]]) -> None:
    """rows: (token, position, sequence, wants logits), into the backend's batch."""
    batch = b.live.batch
    batch.n_tokens = len(rows)
    for j, (tok, pos, seq, logits) in enumerate(rows):
        batch.token[j], batch.pos[j], batch.n_seq_id[j], batch.seq_id[j][0] = tok, pos, 1, seq
        batch.logits[j] = 1 if logits else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8, help="decoding agents")
    p.add_argument("--chunk", type=int, default=192, help="prefill tokens of the returning agent")
    p.add_argument("--contexts", default="256,1024,1536")
    p.add_argument("--reps", type=int, default=12)
    p.add_argument("--threads", type=int, default=None)
    a = p.parse_args()
    contexts = [int(x) for x in a.contexts.split(",")]
    n = a.batch + 1  # the decoding agents and the one being prefilled
    b = LlamaBackend(read_model_facts(default_model_path()), n_threads=a.threads, chunk_tokens=512)
    text = b.text.tokenize("def step(self, batch):\n    return [agent.next() for agent in batch]\n" * 200)
    print(f"{a.batch} decoding agents + a {a.chunk}-token prefill, {b.n_threads} threads, {b.info.device}")
    print(f"{'context':>8s} {'two calls s':>12s} {'one call s':>11s} {'ratio':>6s}")
    mid = None
    for ctx in contexts:
        b.open(KV("f16"), n, ctx + a.chunk + a.reps * 2 + 8)
        for s in range(n):  # every sequence holds ctx tokens
            for i in range(0, ctx, 256):
                b.steps.prefill(s, text[i : min(i + 256, ctx)], i)
        two, one = [], []
        pos = ctx
        for r in range(a.reps * 2 + 2):
            chunk = text[ctx : ctx + a.chunk]
            dec = [(text[pos], pos, s, True) for s in range(a.batch)]
            pre = [(t, ctx + j, a.batch, j == len(chunk) - 1) for j, t in enumerate(chunk)]
            t0 = time.perf_counter()
            if r % 2 == 0:
                fill(b, dec)
                ll.llama_decode(b.live.ctx, b.live.batch)
                fill(b, pre)
                ll.llama_decode(b.live.ctx, b.live.batch)
            else:
                fill(b, dec + pre)
                ll.llama_decode(b.live.ctx, b.live.batch)
            ll.llama_synchronize(b.live.ctx)
            dt = time.perf_counter() - t0
            if r >= 2:  # the first of each kind warms up
                (two if r % 2 == 0 else one).append(dt)
            ll.llama_memory_seq_rm(b.live.mem, a.batch, ctx, -1)  # the prefilled agent back to ctx tokens
            pos += 1
        t2, t1 = statistics.median(two), statistics.median(one)
        print(f"{ctx:8d} {t2:12.4f} {t1:11.4f} {t1 / t2:6.3f}")
        if ctx == contexts[len(contexts) // 2]:
            mid = t1 / t2
    b.close()
    print(f"ratio: {mid:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A new conversation whose prompt begins with another agent's cached prefix: copy those cells
(llama_memory_seq_cp, then cut the copy to the prefix) or prefill them again? On the default model.

With one KV stream per agent (swarmtune's cache, llama-server's with -np), a copy between streams moves
the whole stream's buffer at the next llama_decode, whatever the prefix's length. For each prefix length,
the time to the new agent's first sampled token both ways (the copy realised by that first call), the
median of --reps, and their ratio; the last line is `ratio: X` (copy over prefill) at 256 tokens.

    python bench/prefix_copy.py [--prefixes 32,64,256,1024] [--ctx 2048] [--reps 7]
"""

import argparse
import statistics
import sys
import time

from swarmtune.engine.backends.llama_backend import LlamaBackend
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.model.default_model import default_model_path
from swarmtune.engine.model.model_facts import read_model_facts


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prefixes", default="32,64,256,1024")
    p.add_argument("--ctx", type=int, default=2048, help="cells per stream")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--kv", type=KVSetting.parse, default="f16")
    a = p.parse_args()
    b = LlamaBackend(read_model_facts(default_model_path()), chunk_tokens=256)
    text = b.text.tokenize("class Agent:\n    def turn(self, prompt):\n        return self.model(prompt)\n" * 300)
    b.open(a.kv, 2, a.ctx)
    b.steps.seed_sampler(1, 0)
    print(f"{b.info.device}, {b.n_threads} threads, KV {a.kv}, {a.ctx} cells per stream")
    print(f"{'prefix':>7s} {'prefill s':>10s} {'copy s':>8s} {'ratio':>6s}")
    at256 = None
    for n in (int(x) for x in a.prefixes.split(",")):
        prefix, tail = text[:n], text[n : n + 8]
        for i in range(0, n, 256):  # the donor holds the prefix
            b.steps.prefill(0, prefix[i : i + 256], i)
        fill, copy = [], []
        for _ in range(a.reps):
            b.cells.drop(1)
            t0 = time.perf_counter()
            for i in range(0, n, 256):
                b.steps.prefill(1, prefix[i : i + 256], i)
            b.steps.prefill(1, tail, n)
            b.steps.first_token_after_prefill(1)
            fill.append(time.perf_counter() - t0)
            b.cells.drop(1)
            t0 = time.perf_counter()
            b.cells.copy(0, 1)
            b.cells.truncate(1, n)
            b.steps.prefill(1, tail, n)  # the copy is made in this call's update, before its compute
            b.steps.first_token_after_prefill(1)
            copy.append(time.perf_counter() - t0)
        f, c = statistics.median(fill), statistics.median(copy)
        print(f"{n:7d} {f:10.4f} {c:8.4f} {c / f:6.3f}")
        if n == 256:
            at256 = c / f
        b.cells.drop(0)
    b.close()
    if at256 is not None:
        print(f"ratio: {at256:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

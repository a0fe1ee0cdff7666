"""Two swarmtune nodes behind the SGLang Model Gateway (`sglang-router`), its cache-aware policy against
round-robin, on the same seeded client swarm: conversations that share a system prompt, each several turns
long, and a parent with two sub-agents (tests/agent_traces.py), run concurrently through the router.

Each round starts both nodes and the router fresh for each policy, policies alternated; at least three
rounds, medians and spreads printed. Prefilled tokens come from the nodes' own answers (each response's
`swarmtune` object); TTFT is timed at the first text byte. On a 2-core machine each node runs one thread of
the default model: the absolute figures mean nothing beyond the comparison.

    python bench/fleet.py

Last line: `cache-aware vs round-robin prefill ratio: X` (prefilled tokens, cache-aware over round-robin)."""

import argparse
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]

from serve_vs_llama_server import free_port, stop  # noqa: E402

from tests.agent_traces import TRACES, TraceTurn, TurnResult, replay  # noqa: E402

POLICIES = ("cache_aware", "round_robin")


def conversations(seed: int, n: int) -> list[list[TraceTurn]]:
    """n opencode-shaped conversations (one system prompt, their own tool outputs) and the sub-agents trace."""
    return [TRACES["opencode"](seed + i, turns=4) for i in range(n)] + [TRACES["subagents"](seed)]


def start_node(threads: int, agents: int, ctx: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "swarmtune", "serve", "--clients", "--port", str(port),
                             "--agents", str(agents), "--ctx", str(ctx), "--threads", str(threads)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait(url + "/health", proc, lambda r: r.status_code == 200)
    return proc, url


def start_router(policy: str, nodes: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port",
                             str(port), "--worker-urls", *nodes, "--policy", policy, "--log-level", "warn"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait(url + "/workers", proc, lambda r: len(r.json().get("workers", [])) == len(nodes))
    return proc, url


def wait(url: str, proc: subprocess.Popen, ok, timeout_s: float = 300) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{url}: the process exited ({proc.returncode})")
        try:
            if ok(httpx.get(url, timeout=2)):
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.5)
    stop(proc)
    raise SystemExit(f"{url}: not ready in {timeout_s:.0f} s")


def run(policy: str, a: argparse.Namespace) -> tuple[list[TurnResult], float]:
    with ExitStack() as stack:
        nodes = []
        for _ in range(2):
            proc, url = start_node(a.threads, a.agents, a.ctx)
            stack.callback(stop, proc)
            nodes.append(url)
        proc, url = start_router(policy, nodes)
        stack.callback(stop, proc)
        convs = conversations(a.seed, a.conversations)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(len(convs)) as pool:
            # every turn generates exactly gen_tokens (past any end), so tok/s compares the same work
            results = list(pool.map(lambda c: replay(url, c, max_tokens=a.gen_tokens, extra={"ignore_eos": True}),
                                    convs))
        return [t for r in results for t in r], time.perf_counter() - t0


def spread(xs: list[float], fmt: str = ".3f") -> str:
    return f"{statistics.median(xs):{fmt}} ({min(xs):{fmt}}-{max(xs):{fmt}})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--conversations", type=int, default=4, help="opencode-shaped conversations (plus sub-agents)")
    p.add_argument("--agents", type=int, default=4, help="agents per node")
    p.add_argument("--ctx", type=int, default=3072)
    p.add_argument("--threads", type=int, default=1, help="threads per node")
    p.add_argument("--gen-tokens", type=int, default=8)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    if a.rounds < 3:
        p.error("--rounds must be at least 3")
    print(f"2 nodes x {a.agents} agents of {a.ctx} tokens, {a.threads} thread(s) each, default model; "
          f"{a.conversations} conversations + a parent with 2 sub-agents, concurrent; seed {a.seed}", flush=True)
    prefilled: dict[str, list[int]] = {p: [] for p in POLICIES}
    rate: dict[str, list[float]] = {p: [] for p in POLICIES}
    ttft: dict[str, list[float]] = {p: [] for p in POLICIES}
    for r in range(a.rounds):
        for policy in (POLICIES if r % 2 == 0 else POLICIES[::-1]):
            turns, wall = run(policy, a)
            prefilled[policy].append(sum(t.prefilled_tokens for t in turns))
            rate[policy].append(sum(a.gen_tokens for _ in turns) / wall)
            ttft[policy].append(statistics.median(t.ttft_s for t in turns))
            print(f"round {r + 1} {policy}: {sum(t.prompt_tokens for t in turns):,} prompt tokens, "
                  f"{prefilled[policy][-1]:,} prefilled, {wall:.0f} s", flush=True)
    for policy in POLICIES:
        print(f"{policy:12s} prefilled {spread(prefilled[policy], ',.0f')}  tok/s {spread(rate[policy], '.2f')}  "
              f"TTFT p50 {spread(ttft[policy])} s")
    ratios = [c / r for c, r in zip(prefilled["cache_aware"], prefilled["round_robin"], strict=True)]
    print(f"cache-aware vs round-robin prefill ratio: {statistics.median(ratios):.3f} "
          f"({min(ratios):.3f}-{max(ratios):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

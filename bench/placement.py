"""How long a served request's placement takes when every agent holds a long conversation: which agent
continues it, which one it displaces, what it copies from another agent, which chunks of old cells it keeps.

The swarm: `--agents` agents (64) on the simulated card (placement is the host's work alone: the sim's cell
operations are bookkeeping), each holding a conversation of `--tokens` tokens (8k) that begins with one
shared system prompt (1,024 tokens, as agents of one harness share theirs), the rest its own, served with
--cache-reuse at its default. Then one request at a time, each placed by the server's own call
(`ServedAgents.before_step`, which the engine makes at the start of a step), timed around that call:

- continue: an agent's whole conversation and a new user turn, after every agent took a turn (each
  conversation grew by a user message and a reply since the last placement);
- new: the system prompt and a conversation no agent holds (every agent busy or holding one: it displaces
  the least valuable and copies the shared prefix);
- trimmed: an agent's conversation with 512 tokens cut from its middle (the prefix it shares, the chunks
  after the cut kept shifted).

Each round builds the swarm afresh; medians with min-max over `--rounds`. Also printed, not in the bar:
`first look`, the first placement after the swarm's prompts were all prefilled (whatever the server
learns of the conversations it has not seen grow, it learns there).

    python bench/placement.py                  # 64 agents x 8k tokens, 5 rounds (~1 min)
    python bench/placement.py --agents 8 64 --tokens 2048 8192

The bar (issue 51): under 1 ms at 64 agents x 8k tokens. Last line:
`placement at 64 agents x 8192 tokens: worst X us (lo-hi)`.
"""

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("SWARMTUNE_CHECK", "0")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from machine import cpu_name  # noqa: E402

from swarmtune.engine.agents.served import ServedAgents  # noqa: E402
from swarmtune.engine.agents.served_request import ServedRequest  # noqa: E402
from swarmtune.engine.backends.sim_backend import SimBackend  # noqa: E402
from swarmtune.engine.conversation.sampling import SamplingParams  # noqa: E402
from swarmtune.engine.engine import Engine, EngineSettings  # noqa: E402
from swarmtune.engine.model.profiles import profile  # noqa: E402

SYSTEM_TOKENS = 1024
CASES = ("continue", "new", "trimmed")
TURN_TOKENS = 64  # a user message between two placements
REPLY_TOKENS = 32


def ask(served: ServedAgents, prompt: list[int], max_tokens: int = 2) -> ServedRequest:
    r = ServedRequest(prompt=list(prompt), max_tokens=max_tokens, params=SamplingParams(seed=1),
                      emit=lambda ev: None)
    served.submit(r)
    return r


def swarm(agents: int, tokens: int, seed: int) -> tuple[Engine, ServedAgents, list[list[int]]]:
    backend = SimBackend(profile("rx9070xt-qwen3.5-9b"))
    served = ServedAgents(backend, max_queue=agents)
    e = Engine(backend, EngineSettings(agents=agents, batch_cap=agents, ctx_per_agent=tokens + 1024,
                                       chunk_tokens=512, reference=False, check=False), agents=served)
    rng = random.Random(seed)
    system = [rng.randrange(1000, 30000) for _ in range(SYSTEM_TOKENS)]
    convs = [system + [rng.randrange(1000, 30000) for _ in range(tokens - SYSTEM_TOKENS)] for _ in range(agents)]
    reqs = [ask(served, c) for c in convs]
    while not all(r.finish_reason is not None for r in reqs):
        e.step()
    return e, served, convs


def place(e: Engine, served: ServedAgents, prompt: list[int]) -> float:
    ask(served, prompt)
    t0 = time.perf_counter()
    served.before_step(e.agents, e.now_s())
    return time.perf_counter() - t0


def round_once(agents: int, tokens: int, seed: int) -> dict[str, float]:
    e, served, convs = swarm(agents, tokens, seed)
    rng = random.Random(seed + 1)
    out = {}
    held = [a for a in e.agents if a.history]
    out["first look"] = place(e, served, held[0].history + [rng.randrange(1000, 30000) for _ in range(8)])
    # every agent takes a turn: a user message, a reply
    turns = [ask(served, a.history + [rng.randrange(1000, 30000) for _ in range(TURN_TOKENS)], REPLY_TOKENS)
             for a in held[1:]]
    while not all(r.finish_reason is not None for r in turns):
        e.step()
    a = held[len(held) // 2]
    out["continue"] = place(e, served, a.history + [rng.randrange(1000, 30000) for _ in range(TURN_TOKENS)])
    fresh = convs[0][:SYSTEM_TOKENS] + [rng.randrange(1000, 30000) for _ in range(tokens - SYSTEM_TOKENS)]
    out["new"] = place(e, served, fresh)
    b = next(x for x in held if x is not a and x.history)
    mid = len(b.history) // 2
    out["trimmed"] = place(e, served, b.history[:mid] + b.history[mid + 512 :] + [rng.randrange(1000, 30000)])
    served.close_all()
    e.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, nargs="+", default=[64])
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192])
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores; the simulated card's bookkeeping, the server's own "
          "placement call")
    last = ""
    for n in a.agents:
        for tokens in a.tokens:
            runs = [round_once(n, tokens, seed) for seed in range(a.rounds)]
            parts = []
            for case in ("first look", *CASES):
                xs = [r[case] * 1e6 for r in runs]
                parts.append(f"{case} {statistics.median(xs):,.0f} us ({min(xs):,.0f}-{max(xs):,.0f})")
            print(f"{n} agents x {tokens} tokens: " + "; ".join(parts), flush=True)
            worst = [max(r[c] for c in CASES) * 1e6 for r in runs]
            last = (f"placement at {n} agents x {tokens} tokens: worst {statistics.median(worst):,.0f} us "
                    f"({min(worst):,.0f}-{max(worst):,.0f})")
    print(last)


if __name__ == "__main__":
    main()

"""The prefix index answers what walking every agent's tokens answers: which agent shares most of a prompt,
how much of an agent's conversation no other agent's cells hold (to a block), and which agent's cells give
most of a prompt with --cache-reuse's runs; on random swarms whose conversations share system prompts, are
edited, trimmed and grown, against the plain walks they replace."""

import random

import pytest

from swarmtune.engine.agents.agent import Agent, AgentState, Residency
from swarmtune.engine.agents.cell_reuse import CellReuse, known
from swarmtune.engine.agents.cells import Cells
from swarmtune.engine.agents.prefix_index import BLOCK_TOKENS, PrefixIndex
from swarmtune.engine.backends.sim_backend import SimBackend
from swarmtune.engine.conversation import chunk_reuse
from swarmtune.engine.conversation.token_hashes import common_prefix
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.model.profiles import profile
from tests.conftest import SIM


def _reuse(n: int, cache_reuse: int) -> CellReuse:
    b = SimBackend(profile(SIM))
    b.open(KVSetting.parse("f16"), n, 4096)
    return CellReuse(b, Cells(b), cache_reuse, copy_prefix=True)


def _walk_reusable(r: CellReuse, held: list[int], prompt: list[int]) -> int:
    n = min(common_prefix(held, prompt), len(prompt) - 1)
    return n + sum(c.tokens for c in r.plan(held, prompt, n))


def _swarm(rng: random.Random, n: int) -> tuple[list[Agent], list[list[int]]]:
    vocab = rng.choice([3, 50, 5000])  # a tiny vocabulary repeats itself: runs and near-misses everywhere
    systems = [[rng.randrange(vocab) for _ in range(rng.randrange(0, 90))] for _ in range(3)]
    texts = []
    agents = []
    for i in range(n):
        t = rng.choice(systems) + [rng.randrange(vocab) for _ in range(rng.randrange(0, 300))]
        if texts and rng.random() < 0.3:  # an edit of another conversation
            t = list(rng.choice(texts))
            if t:
                at = rng.randrange(len(t))
                t = t[:at] + [rng.randrange(vocab) for _ in range(rng.randrange(0, 5))] + t[at + rng.randrange(0, 80):]
        texts.append(t)
        cut = rng.randrange(len(t) + 1) if rng.random() < 0.2 else len(t)  # some still prefill
        a = Agent(id=i, seq=i, limit=4096, history=t[:cut], pending=t[cut:], state=AgentState.CLIENT,
                  residency=rng.choice([Residency.CACHE] * 4 + [Residency.HOST]))
        agents.append(a)
    return agents, texts


def _prompt(rng: random.Random, texts: list[list[int]]) -> list[int]:
    base = list(rng.choice(texts)) or [1, 2]
    kind = rng.randrange(4)
    if kind == 0:  # a continuation
        return base + [rng.randrange(7) for _ in range(rng.randrange(1, 40))]
    if kind == 1 and len(base) > 10:  # trimmed in the middle
        at = rng.randrange(len(base) - 5)
        return base[:at] + base[at + rng.randrange(1, 90):] + [5]
    if kind == 2:  # a prefix of one
        return base[: rng.randrange(1, len(base) + 1)] + [rng.randrange(7)]
    return [rng.randrange(7) for _ in range(rng.randrange(2, 200))]


@pytest.mark.parametrize("cache_reuse", [0, 64, 8])
def test_the_index_answers_as_the_walks_do(cache_reuse):
    rng = random.Random(cache_reuse)
    for _round in range(40):
        r = _reuse(12, cache_reuse)
        agents, texts = _swarm(rng, 12)
        for _ in range(6):
            prompt = _prompt(rng, texts)
            p = r.hashed(prompt, agents)
            free = [a for a in agents if rng.random() < 0.7] or agents[:1]
            walked = max(free, key=lambda a: (common_prefix(known(a), prompt), -a.id))
            assert r.longest_prefix(p, free) is walked
            for a in agents:
                most = max((common_prefix(d.history, known(a)) for d in r.donors(a, agents)), default=0)
                assert r.own_tokens([a], agents)[a.id] == len(known(a)) - most // BLOCK_TOKENS * BLOCK_TOKENS
                assert r.reusable(a, p) == _walk_reusable(r, known(a), prompt)
                donors = r.donors(a, agents)
                gives, best = r.best_copy(p, a, agents)
                if not donors:
                    assert (gives, best) == (0, None)
                    continue
                walk = {d.id: _walk_reusable(r, d.history, prompt) for d in donors}
                assert gives == max(walk.values())
                assert best is max(donors, key=lambda d: walk[d.id])
            # the swarm moves on: one conversation grows, one is edited
            g = rng.choice(agents)
            g.decoded(rng.randrange(7), 0) if not g.pending else g.prefilled(len(g.pending))
            e = rng.choice(agents)
            if e.history:
                e.truncated(rng.randrange(len(e.history)))


def test_an_index_kept_up_through_edits_is_the_one_built_afresh():
    rng = random.Random(5)
    agents, _ = _swarm(rng, 10)
    kept = PrefixIndex(chunk_reuse.seed_tokens(16), 16)
    for _ in range(300):
        a = rng.choice(agents)
        move = rng.randrange(7)
        if move == 0 and a.history:
            a.truncated(rng.randrange(len(a.history)))
        elif move == 1:
            a.rewound(rng.randrange(len(known(a)) + 1))
        elif move == 2:
            a.start([rng.randrange(9) for _ in range(rng.randrange(0, 120))])
        elif move == 3:
            a.copied(list(rng.choice(agents).history))
        elif move == 4 and a.pending:
            a.prefilled(rng.randrange(len(a.pending) + 1))
        else:
            a.decoded(rng.randrange(9), 0)
        if rng.random() < 0.3:
            kept.sync(agents)
    kept.sync(agents)
    fresh = PrefixIndex(chunk_reuse.seed_tokens(16), 16)
    fresh.sync(agents)
    for a in agents:
        k, f = kept._known[a.id], fresh._known[a.id]
        assert k.hashes.n == f.hashes.n == len(known(a))
        assert (k.hashes.prefix[: k.hashes.n + 1] == f.hashes.prefix[: f.hashes.n + 1]).all()
        assert (k.blocks, k.anchors, k.windows) == (f.blocks, f.anchors, f.windows)
        assert (k.mins[: k.windows] == f.mins[: f.windows]).all()
    assert kept._blocks == fresh._blocks and kept._anchors == fresh._anchors

"""--draft auto: each agent's draft length from what was measured on this backend, this run: the seconds a
plain decode step takes at each batch size, the seconds each verified row adds to a step, and each agent's
share of drafted tokens kept. A draft of d tokens pays where the step's tokens per second with it beat the
step's without it:

    (B + E(d)) / (t_B + d·(c + g))  >  B / t_B        E(d) = a + a² + ... + a^d   (a: the agent's share kept)

a is measured apart for each class of the match behind a draft (engine/spec/ngram_drafter.py match_class): a
guess behind 24 agreeing tokens is kept far more often than one behind 3, so where a row costs much (a CPU
step) only the long matches' drafts may pay.

t_B the plain step at batch B, c a verified row's seconds, g the seconds drafting takes a drafted token (a
draft model's calls, --draft-model, measured; 0 for the n-gram lookup, whose host seconds are bookkeeping).
Where a row costs what an agent's row costs (a compute-bound CPU step), nothing pays and drafts stay off;
where rows are nearly free (a GPU step bound by the weight stream) every likely draft pays. Until both are
measured, and now and then after (contexts grow, and with them t_B), a step drafts EXPLORE_TOKENS tokens an
agent to measure them: one in EXPLORE_EVERY while drafts pay, half as often each time they did not, down to
one in EXPLORE_EVERY_MAX, and that at once where not even drafts all kept would pay."""

from dataclasses import dataclass, field

EXPLORE_EVERY = 16  # steps: one in this many drafts to measure, whatever the rule says...
EXPLORE_EVERY_MAX = 256  # ...and half as often each time the rule then drafted nothing, down to this
EXPLORE_TOKENS = 2
EMA = 0.2  # weight of each new measure in the running figures
PRIOR_KEPT = 0.5  # an agent's share kept before it has drafted
# a length is taken only where its forecast beats no drafts by this much: t_B and c are running figures off
# a noisy host, and a wrong yes costs whole rows
MARGIN = 1.05


def expected_kept(share: float, d: int) -> float:
    """Tokens kept of d drafted, each kept with probability `share` while all before it were."""
    return sum(share ** i for i in range(1, d + 1))


@dataclass
class DraftPolicy:
    max_tokens: int
    plain_s: dict[int, float] = field(default_factory=dict)  # batch size -> a plain decode step's seconds
    row_s: float | None = None  # a verified row's seconds, beyond the plain step at its batch size
    draft_s: float = 0.0  # drafting's seconds a drafted token (a draft model's: one call for a batch's tokens)
    # (agent id, match class) -> share of its drafted tokens kept
    kept: dict[tuple[int, int], float] = field(default_factory=dict)
    classes: dict[int, int] = field(default_factory=dict)  # agent id -> the class of its draft this step
    steps: int = 0
    explore_every: int = EXPLORE_EVERY
    _since_explore: int = 0

    def lengths(self, ids: list[int], classes: list[int] | None = None) -> list[int]:
        """Each agent's draft length for the next decode step of these agents, whose drafts stand on matches of
        these classes (all 0 where not said: a draft model's)."""
        classes = classes if classes is not None else [0] * len(ids)
        self.classes = dict(zip(ids, classes, strict=True))
        self.steps += 1
        self._since_explore += 1
        b = len(ids)
        t = self.plain_s.get(b)
        if t is None or self.row_s is None or self._since_explore >= self.explore_every:
            # measure: a plain step at this size first, then drafts, then now and then again
            self._since_explore = 0
            return [0 if t is None else min(EXPLORE_TOKENS, self.max_tokens)] * b
        out = [self._best(self.kept.get((i, c), PRIOR_KEPT), b, t) for i, c in zip(ids, classes, strict=True)]
        if self._since_explore == 1:  # the first choice after a measure: was it worth measuring so often?
            if any(out):
                self.explore_every = EXPLORE_EVERY
            elif self._best(1.0, b, t) == 0:
                # not even drafts all kept would pay: a row (and its drafting) costs what an agent's does. What
                # changes that (contexts growing t_B) is slow; a draft model's measure also brings its cache
                # level with every history, a prefill of all that is new since the last
                self.explore_every = EXPLORE_EVERY_MAX
            else:
                self.explore_every = min(2 * self.explore_every, EXPLORE_EVERY_MAX)
        return out

    def could_pay(self, b: int) -> bool:
        """Whether the next step of b agents may draft at all: it measures, or drafts every one kept would pay
        (where they would not, no lookup need be made for it: its lengths will all be 0)."""
        t = self.plain_s.get(b)
        if t is None or self.row_s is None or self._since_explore + 1 >= self.explore_every:
            return True
        return self._best(1.0, b, t) > 0

    def _best(self, share: float, b: int, t: float) -> int:
        c = max(self.row_s or 0.0, 1e-9) + self.draft_s
        rate = [(b + expected_kept(share, d)) / (t + d * c) for d in range(self.max_tokens + 1)]
        best = max(range(self.max_tokens + 1), key=lambda d: (rate[d], -d))
        return best if rate[best] >= MARGIN * rate[0] else 0

    def observed(self, batch: int, seconds: float, drafted: int) -> None:
        """A decode step of `batch` agents that verified `drafted` tokens took `seconds`."""
        if seconds <= 0:
            return
        if not drafted:
            old = self.plain_s.get(batch)
            self.plain_s[batch] = seconds if old is None else old + EMA * (seconds - old)
            return
        t = self.plain_s.get(batch)
        if t is not None:
            c = max(0.0, seconds - t) / drafted
            self.row_s = c if self.row_s is None else self.row_s + EMA * (c - self.row_s)

    def drafting(self, rounds: int, seconds: float) -> None:
        """Drafting for a step took `seconds` and drafted at most `rounds` tokens an agent (a draft model: a
        call per round, the batch's agents in each)."""
        if rounds > 0:
            g = seconds / rounds
            self.draft_s = g if not self.draft_s else self.draft_s + EMA * (g - self.draft_s)

    def verified(self, agent_id: int, drafted: int, kept: int) -> None:
        if drafted:
            # each drafted token was tried only where every one before it was kept: k kept of k + 1 tried,
            # or of k where all were kept
            s = kept / (kept + (kept < drafted))
            key = (agent_id, self.classes.get(agent_id, 0))
            old = self.kept.get(key)
            self.kept[key] = s if old is None else old + EMA * (s - old)

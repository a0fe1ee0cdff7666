"""The energy ledger: joules per token per batch size, and whether one more agent still pays.

Energy per token = power / throughput. Batching raises both; the fixed floor amortizes with
throughput, the per-agent compute term does not, so the energy gain trails the throughput gain."""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Marginal:
    batch: int
    joules_per_token_now: float
    joules_per_token_next: float  # with one more agent in the batch (modeled)

    @property
    def lowers(self) -> bool:
        return self.joules_per_token_next < self.joules_per_token_now


class EnergyLedger:
    """Per batch size: joules and tokens of decode steps; a linear power model watts = floor + per_agent * B."""

    def __init__(self) -> None:
        self.joules: dict[int, float] = {}
        self.tokens: dict[int, int] = {}
        self.seconds: dict[int, float] = {}

    def add(self, batch: int, joules: float, tokens: int, seconds: float) -> None:
        self.joules[batch] = self.joules.get(batch, 0.0) + joules
        self.tokens[batch] = self.tokens.get(batch, 0) + tokens
        self.seconds[batch] = self.seconds.get(batch, 0.0) + seconds

    def joules_per_token(self, batch: int) -> float | None:
        t = self.tokens.get(batch, 0)
        return self.joules[batch] / t if t else None

    def power_model(self) -> tuple[float, float] | None:
        """(floor watts, watts per agent) fitted over the batch sizes seen; None with fewer than two."""
        bs = [b for b in self.seconds if self.seconds[b] > 0]
        if len(bs) < 2:
            return None
        w = [self.joules[b] / self.seconds[b] for b in bs]
        per_agent, floor = np.polyfit(bs, w, 1)
        return float(floor), float(per_agent)

    def marginal(self, batch: int, step_seconds: Callable[[int], float],
                 watts_at: Callable[[int], float] | None = None) -> Marginal | None:
        """J/token at `batch` and at `batch + 1`, from step time t(B) and power P(B) (fitted if not given)."""
        if watts_at is None:
            model = self.power_model()
            if model is None:
                return None
            floor, per_agent = model
            watts_at = lambda b: floor + per_agent * b  # noqa: E731
        now = watts_at(batch) * step_seconds(batch) / batch
        nxt = watts_at(batch + 1) * step_seconds(batch + 1) / (batch + 1)
        return Marginal(batch, now, nxt)

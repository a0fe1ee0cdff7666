"""The forecasts' simulator on a real backend: this very run, calibrated on its own steps; and the step
cost a decision's closed loop checks measured steps against."""

from swarmtune.engine.backends.sim_backend import SimBackend
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.measure.prefill_model import PrefillFit
from swarmtune.engine.measure.step_model import Fit
from swarmtune.engine.model.profiles import Profile


class CalibratedSim(SimBackend):
    """A simulator of this very run on a real backend: step times from the fit measured per KV type.
    A KV type not run yet has the fit of one that was, scaled by what a probe timed of both in a side
    cache (engine/measure/kv_probe.py): its step time is not guessed from its bytes (a smaller cache type reads
    fewer, but dequantizing it may cost more: slower on a CPU, faster on a GPU). Where no probe could run,
    it borrows another type's fit unscaled, and the decision says so."""

    def __init__(self, p: Profile, fits: dict[KVSetting, Fit], prefills: dict[KVSetting, PrefillFit],
                 base_kv: KVSetting) -> None:
        super().__init__(p)
        self.fits = fits
        self.prefills = prefills  # per KV type: prefill slows as the history grows, by the type
        self.base_kv = base_kv  # the run's own type: what a type never timed borrows

    def prefill(self, seq: int, tokens: list[int], pos0: int) -> float:
        super().prefill(seq, tokens, pos0)  # the cache's bookkeeping, and its checks
        return self.prefill_seconds(len(tokens), pos0, self.kv)

    def prefill_seconds(self, tokens: int, pos0: int, kv: KVSetting | None = None) -> float:
        kv = kv or self.kv
        fit = self.prefills.get(kv) or self.prefills.get(self.base_kv) or next(iter(self.prefills.values()))
        sc = self.scale.get(kv)
        return fit.seconds(tokens, pos0) * (sc.prefill if sc else 1.0)

    def step_seconds(self, batch: int, total_context: float, kv: KVSetting | None = None,
                     contexts: list[float] | None = None) -> float:
        kv = kv or self.kv
        fit = self.fits.get(kv) or self.fits.get(self.base_kv)
        bm = self.profile.bytes_model
        ctx = contexts if contexts is not None else [total_context / max(batch, 1)] * batch
        if fit is None:
            fit = next(iter(self.fits.values()))
        tokens = [bm.kv_equivalent_tokens(kv, c) for c in ctx]
        seconds = max(fit.step_seconds(batch, sum(tokens), max(tokens, default=0.0)), 1e-6)
        sc = self.scale.get(kv)
        if sc is None:
            return seconds
        if sc.attention is None:
            return seconds * sc.decode
        weights_s = fit.step_seconds(batch, 0.0, 0.0)
        return max(weights_s + sc.attention * (seconds - weights_s), 1e-6)


# a correction is put on attention alone where attention was at least this share of the modeled decode time,
# and by at most this factor either way: a small share reads the steps' noise as a large change of a small
# term, which the clamp bounds and the pairs' spread then shows as a wide interval (not a verdict)
ATTENTION_MIN_SHARE = 0.01
ATTENTION_MAX_FACTOR = 4.0


def attention_factor(q: float, base_share: float) -> float | None:
    """The factor on attention alone that makes measured over modeled time q, where the modeled time was
    base_share fixed cost and the rest attention; None where attention was too small a share to tell."""
    share = 1.0 - base_share
    if share < ATTENTION_MIN_SHARE:
        return None
    return min(max((q - base_share) / share, 1 / ATTENTION_MAX_FACTOR), ATTENTION_MAX_FACTOR)


class SimStepCost:
    """A step's cost as a forecast's simulator models it: what an experiment (engine/tune/experiment.py)
    holds each measured step against, frozen at the experiment's start."""

    def __init__(self, sim: SimBackend) -> None:
        self.sim = sim

    def decode_seconds(self, batch: int, contexts: list[float], kv: KVSetting) -> float:
        return self.sim.step_seconds(batch, sum(contexts), kv=kv, contexts=contexts)

    def decode_base_seconds(self, batch: int, kv: KVSetting) -> float:
        """The part of a decode step that does not grow with the cached tokens (the weights' stream)."""
        return self.sim.step_seconds(batch, 0.0, kv=kv, contexts=[0.0] * batch)

    def prefill_seconds(self, tokens: int, pos0: int, kv: KVSetting) -> float:
        return self.sim.prefill_seconds(tokens, pos0, kv)

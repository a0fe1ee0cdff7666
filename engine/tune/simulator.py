"""The forecasts' simulator on a real backend: this very run, calibrated on its own steps; and the step
cost a decision's closed loop checks measured steps against."""

from swarmtune.engine.prefill_model import PrefillFit
from swarmtune.engine.profiles import Profile
from swarmtune.engine.sim_backend import SimBackend
from swarmtune.engine.step_model import Fit

# a correction is put on attention alone only where attention was at least this share of the modeled time:
# below it, the steps' noise would be read as a large change of a small term
ATTENTION_MIN_SHARE = 0.15
# and by at most this factor either way (the probe's clamp, engine/kv_probe.py): past it, noise
ATTENTION_MAX_FACTOR = 4.0


def attention_factor(q: float, base_share: float) -> float | None:
    """The factor on attention that makes measured over modeled time q, where the modeled time was
    base_share fixed cost and the rest attention; None where attention was too small a share to tell."""
    share = 1.0 - base_share
    if share < ATTENTION_MIN_SHARE:
        return None
    f = (q - base_share) / share
    return min(max(f, 1 / ATTENTION_MAX_FACTOR), ATTENTION_MAX_FACTOR)


class CalibratedSim(SimBackend):
    """A simulator of this very run on a real backend: step times from the fit measured per KV type.
    A KV type not run yet has the fit of one that was, scaled by what a probe timed of both in a side
    cache (engine/kv_probe.py): its step time is not guessed from its bytes (a smaller cache type reads
    fewer, but dequantizing it may cost more: slower on a CPU, faster on a GPU). Where no probe could run,
    it borrows another type's fit unscaled, and the decision says so."""

    def __init__(self, p: Profile, fits: dict[str, Fit], prefills: dict[str, PrefillFit], base_kv: str) -> None:
        super().__init__(p)
        self.fits = fits
        self.prefills = prefills  # per KV type: prefill slows as the history grows, by the type
        self.base_kv = base_kv  # the run's own type: what a type never timed borrows

    def prefill(self, seq: int, tokens: list[int], pos0: int) -> float:
        super().prefill(seq, tokens, pos0)  # the cache's bookkeeping, and its checks
        return self.prefill_seconds(len(tokens), pos0, self.kv)

    def prefill_seconds(self, tokens: int, pos0: int, kv: str | None = None) -> float:
        kv = kv or self.kv
        fit = self.prefills.get(kv) or self.prefills.get(self.base_kv) or next(iter(self.prefills.values()))
        return fit.seconds(tokens, pos0)

    def step_seconds(self, batch: int, total_context: float, kv: str | None = None,
                     contexts: list[float] | None = None) -> float:
        kv = kv or self.kv
        fit = self.fits.get(kv) or self.fits.get(self.base_kv)
        bm = self.profile.bytes_model
        ctx = contexts if contexts is not None else [total_context / max(batch, 1)] * batch
        if fit is None:
            fit = next(iter(self.fits.values()))
        tokens = [bm.kv_equivalent_tokens(kv, c) for c in ctx]
        return max(fit.step_seconds(batch, sum(tokens), max(tokens, default=0.0)), 1e-6)


class SimStepCost:
    """A step's cost as the forecast's simulator models it (engine/tune/watch.py checks steps against it)."""

    def __init__(self, sim: SimBackend) -> None:
        self.sim = sim

    @property
    def calibrated(self) -> bool:
        return isinstance(self.sim, CalibratedSim)

    def corrected(self, kv: str, decode: float, prefill: float, decode_base_share: float = 0.0,
                  prefill_base_share: float = 0.0) -> tuple[Fit, PrefillFit | None]:
        """This model's fits for kv, corrected by what its steps measured: `decode` and `prefill` are measured
        over modeled time, `*_base_share` how much of the modeled time does not grow with the cached tokens.
        The difference is put on attention (what a KV type changes) where attention was at least
        ATTENTION_MIN_SHARE of the steps, so that it grows with the contexts as attention does: a type 1.1x
        slower at 300 tokens a sequence is more so at 1,500. Elsewhere every step time is scaled alike.
        (A calibrated simulator's; the sim profile's own roofline has none to correct.)"""
        if not isinstance(self.sim, CalibratedSim):
            raise ValueError("only a calibrated simulator's model is corrected")
        fit = self.sim.fits.get(kv) or self.sim.fits.get(self.sim.base_kv) or next(iter(self.sim.fits.values()))
        pre = self.sim.prefills.get(kv) or self.sim.prefills.get(self.sim.base_kv)
        f = attention_factor(decode, decode_base_share)
        new_fit = fit.scaled(decode) if f is None else fit.attention_scaled(f)
        if pre is None:
            return new_fit, None
        g = attention_factor(prefill, prefill_base_share)
        return new_fit, pre.scaled(prefill) if g is None else pre.attention_scaled(g)

    def decode_base_seconds(self, batch: int, kv: str) -> float:
        if not isinstance(self.sim, CalibratedSim):
            return 0.0
        fit = self.sim.fits.get(kv) or self.sim.fits.get(self.sim.base_kv) or next(iter(self.sim.fits.values()))
        return fit.batch_seconds(batch)

    def prefill_base_seconds(self, tokens: int, kv: str) -> float:
        if not isinstance(self.sim, CalibratedSim):
            return 0.0
        sim = self.sim
        pre = sim.prefills.get(kv) or sim.prefills.get(sim.base_kv) or next(iter(sim.prefills.values()))
        return tokens * pre.per_token_seconds

    def decode_seconds(self, batch: int, contexts: list[float], kv: str) -> float:
        return self.sim.step_seconds(batch, sum(contexts), kv=kv, contexts=contexts)

    def prefill_seconds(self, tokens: int, pos0: int, kv: str) -> float:
        return self.sim.prefill_seconds(tokens, pos0, kv)

    def move_seconds(self, nbytes: int) -> float:
        return nbytes / self.sim.profile.host_link_bytes_per_s

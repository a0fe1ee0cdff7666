"""How far a prefill chunk may stall the agents that decode meanwhile: the bound (stated, or STALL_DECODE_STEPS of
the swarm's measured decode steps under auto) and the chunk the run's timed chunks say fits in it."""

from swarmtune.engine.measure.analysis import StepAnalysis
from swarmtune.engine.settings import STALL_DECODE_STEPS, EngineSettings

MIN_CHUNK_TOKENS = 16  # a prefill under a stall bound still moves, even where one call costs more than the bound
PROBE_CHUNK_TOKENS = (16, 32, 64)


class StallBound:
    def __init__(self, settings: EngineSettings, analysis: StepAnalysis) -> None:
        self.s = settings  # the engine's own, as they are now
        self.analysis = analysis
        self.probes = 0  # chunks cut to a stall bound before the chunk fit could size them
        self.decode_s: float | None = None  # the swarm's decode steps, measured (a moving mean): --max-stall-ms auto

    def cut(self, n: int, context: int, others_decode: bool) -> tuple[int, str]:
        """A chunk of n tokens at this context cut to the stall bound while other agents decode (what the run's
        timed chunks say fits in it, never under MIN_CHUNK_TOKENS), and the record's note when it was cut."""
        bound = self.bound(context)
        if bound is None or not others_decode:
            return n, ""
        fits = self.analysis.chunk_within(self.s.kv, bound, context, n)
        # before a fit: small chunks of three sizes, so the fit can tell a call's cost from a token's
        cut = min(n, PROBE_CHUNK_TOKENS[self.probes % 3] if fits is None else max(fits, MIN_CHUNK_TOKENS))
        self.probes += fits is None
        return cut, (f"stall bound {bound * 1000:.0f} ms: {cut} of {n} tokens" if cut < n else "")

    def bound(self, context: int) -> float | None:
        """The stall bound for a chunk at this context: the one stated, or under auto STALL_DECODE_STEPS times
        what each chunk adds to its agent's time to its first token: the decode step run after it, and the
        call's own cost at its position (the fit's c + d·p), so that cutting a prompt into chunks costs it at
        most about 1/8 more. Where a call's own cost is small (a GPU, a short context) that is 8 decode steps;
        at 6k cells on a 2-core CPU, whole chunks."""
        if self.s.max_stall_s != "auto":
            return self.s.max_stall_s
        if self.decode_s is None:
            return None
        fit = self.analysis.chunk_fit(self.s.kv)
        return STALL_DECODE_STEPS * (self.decode_s + (fit.call_seconds(context) if fit is not None else 0.0))

    def decode_timed(self, seconds: float) -> None:
        """A decode step of the swarm's (drafts verified or not, no prefill in it) took this long."""
        self.decode_s = seconds if self.decode_s is None else self.decode_s + 0.2 * (seconds - self.decode_s)

"""What the tuner spent: its thinking, its probes, its switches and its experiments, counted as they happen.

Its forecasts and probes run on the engine's own thread: while it thinks, the swarm does not step. So
thinking is counted in the engine's seconds it held up (wall seconds on a real backend, measured; on the
sim, whose clock does not wait for the host, at `Goal.sim_think_s` per forecast, modeled, 0 unless set),
and its CPU seconds beside them. A switch costs the seconds of its rebuild (conversion or re-prefill)
and the cells it converted or prefilled again; an experiment, the tokens its candidate's blocks made
fewer than the incumbent's rate would have over the same time (measured; negative where it gained)."""

from dataclasses import dataclass


@dataclass
class Spending:
    think_s: float = 0.0  # engine seconds held up by forecasts (measured wall, or modeled on the sim)
    think_cpu_s: float = 0.0  # CPU seconds of the engine's thread in them (measured)
    forecasts: int = 0  # runs forward in a simulator
    looks: int = 0
    looks_skipped: int = 0  # looks not taken: the thinking budget was spent
    looks_waived: int = 0  # epochs that took no look: the last found nothing within reach (engine/tune/tuner.py)
    probe_s: float = 0.0  # side-cache probes of KV types (measured)
    switches: int = 0  # the tuner's own changes of setting, experiments' included
    switch_s: float = 0.0  # the seconds of their rebuilds (KV switches), measured or simulated
    switch_cells: int = 0  # cells those rebuilds converted or prefilled again
    experiments: int = 0
    experiment_s: float = 0.0  # engine seconds spent in experiments' blocks
    tokens_lost: float = 0.0  # what the candidates' blocks made fewer than the incumbents' rate (measured)

    def total_s(self) -> float:
        """Engine seconds the tuner took from the swarm outright: thinking, probes, switches."""
        return self.think_s + self.probe_s + self.switch_s

    def to_json(self) -> dict[str, object]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in vars(self).items()} | {"why": self.line()}

    def line(self, run_s: float | None = None) -> str:
        share = f" ({self.total_s() / run_s:.1%} of the run)" if run_s else ""
        return (f"tuner spent {self.total_s():.2f} s{share}: thinking {self.think_s:.2f} s "
                f"({self.forecasts} forecasts, {self.think_cpu_s:.2f} CPU s, {self.looks_skipped} looks skipped, "
                f"{self.looks_waived} waived), "
                f"probes {self.probe_s:.2f} s, {self.switches} switches {self.switch_s:.2f} s "
                f"({self.switch_cells:,} cells); {self.experiments} experiments over {self.experiment_s:.0f} s, "
                f"{self.tokens_lost:+.0f} tokens lost to them (measured)")

"""The forecasts of staying, checked against what came: each look's forecast of the setting in force is
held against the run's own spans as they pass, and their errors are the tuner's stated error (what a
forecast gain must clear, and what an outcome is judged against)."""

import math

from swarmtune.engine.record.records import StepRecord
from swarmtune.engine.tune.goal import Goal, Setting
from swarmtune.engine.tune.tally import SpanTally


class ForecastChecks:
    def __init__(self) -> None:
        self.errors: dict[int, list[float]] = {}  # span index -> forecast / measured - 1 of staying
        # forecasts being checked: (what each span was forecast to hold, what came, at which setting)
        self._open: list[tuple[list[float | None], SpanTally, Setting]] = []

    def restart(self) -> None:
        """Turned on again: the forecasts in flight say nothing of what comes now (the errors stay)."""
        self._open = []

    @property
    def open_settings(self) -> list[Setting]:
        """The setting each forecast still being checked was made for."""
        return [s for *_, s in self._open]

    def add(self, forecast: list[float | None], came: SpanTally, setting: Setting) -> None:
        self._open.append((forecast, came, setting))

    def drop_moved(self, now: Setting) -> None:
        """A forecast of staying says nothing of what came after the setting moved (an experiment, or a
        person): its spans not yet closed are dropped, not compared."""
        self._open = [c for c in self._open if c[2] == now]

    def observe(self, rec: StepRecord, goal: Goal) -> None:
        """A step joins every open check; spans that have passed are compared on the goal's objective."""
        for _, came, _ in self._open:
            came.add(rec)
        keep = []
        for forecast, came, setting in self._open:
            while len(came.closed) > (done := came.checked):
                measured = came.closed[done].objective_value(goal)
                predicted = forecast[done]
                if predicted and measured:
                    self.errors[done] = (self.errors.get(done, []) + [predicted / measured - 1])[-32:]
                came.checked = done + 1
            if len(came.closed) < len(came.spans):
                keep.append((forecast, came, setting))
        self._open = keep

    def stated_error(self, span: int) -> float | None:
        """How far a forecast gain over a span (its index: k+1 epochs) may be from the measured one: twice
        the rms error of the forecasts of staying checked over that span (about 95% of them fall inside),
        or over the longest shorter span with 3 checks (noisier, so wider). None until 3 were checked."""
        for j in range(span, -1, -1):
            errs = self.errors.get(j, [])
            if len(errs) >= 3:
                return 2 * math.sqrt(sum(e * e for e in errs) / len(errs))
        return None

    def forecast_error(self, span: int, prior: float) -> float:
        """The error a move's gain must clear over a span: the rms error measured on this run's forecasts of
        staying (half the stated error an outcome is judged against, which is a 95% band), or the prior
        until three were checked (Goal.prior_error)."""
        err = self.stated_error(span)
        return prior if err is None else err / 2

    def error_source(self, span: int) -> str:
        if self.stated_error(span) is None:
            return "prior: fewer than 3 forecasts of staying checked yet (Goal.prior_error)"
        return "rms error of this run's checked forecasts of staying (measured)"

"""The plots: live batch, speedup vs context (braille charts, tui/widgets/braille.py), the byte split."""

import math

from rich.text import Text

from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.measure.step_model import Fit
from swarmtune.engine.model.bytes_model import ByteModel, bytes_model_from_header
from swarmtune.tui.stats import Stats
from swarmtune.tui.widgets.braille import Chart, Series
from swarmtune.tui.widgets.lines import TextLines
from swarmtune.tui.widgets.status import human_bytes


class _Chart(TextLines):
    """A braille chart (tui/widgets/braille.py), rebuilt by show() and drawn at the widget's size."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.chart = Chart()

    def text(self, width: int, height: int) -> Text:
        return self.chart.render(width, height)


class BatchPlot(_Chart):
    def show(self, stats: Stats) -> None:
        c = Chart(title="live batch per decode step")
        h = list(stats.batch_history)
        if h:
            xs = [float(x[0]) for x in h]
            top = max(max(x[2] for x in h), max(x[3] for x in h), max(x[4] for x in h), 1)
            c.add(Series("cap", xs, [x[2] for x in h], "bright_black"))
            c.add(Series("waiting/filling", xs, [x[3] for x in h], "orange1"))
            if any(x[4] for x in h):  # only when agents wait for tools (--tool-latency)
                c.add(Series("at a tool or client", xs, [x[4] for x in h], "blue"))
            c.add(Series("batch", xs, [x[1] for x in h], "cyan"))
            c.y_range, c.y_ticks = (0.0, top + 0.5), (0, top)
        self.chart = c
        self.redraw()


NO_BYTES = "n/a: W and k unknown (--gguf, or --weight-bytes and --kv-bytes-per-token)"


def bytes_known(h: dict, kv: KVSetting) -> ByteModel | None:
    """The header's byte model (an older recording's W and k make a dense one); None while W or k is unknown."""
    bm = bytes_model_from_header(h)
    if bm is None or not bm.weight_bytes(1):
        return None
    return bm if bm.kv_bytes_per_token(kv) > 0 or bm.state_bytes > 0 else None


def formula_label(bm: ByteModel, b: int) -> str:
    return f"seed formula B={b} (modeled)" if bm.is_dense else f"bytes model B={b}, {bm.kind} (modeled)"


class SpeedupPlot(_Chart):
    def show(self, stats: Stats) -> None:
        r = stats.latest_decode
        h = stats.header
        if r is None or not h:
            self.chart = Chart()
            self.redraw()
            return
        bm = bytes_known(h, r.kv)
        if bm is None:
            self.chart = Chart(title="speedup " + NO_BYTES)
            self.redraw()
            return
        limit = max((a.limit for a in r.agents), default=2048)
        xs = [limit * i / 40 for i in range(41)]
        b = max(r.batch_cap, 1)
        gain = stats.draft_gain or 0.0  # tokens an agent gained a step from kept drafts (measured), while drafting
        top = b * (1 + gain)
        c = Chart(title=f"speedup vs context per agent, KV {r.kv_type}", x_range=(0.0, float(limit)),
                  y_range=(0.0, top + 0.5), y_ticks=(0, b) if not gain else (0, b, round(top, 1)))
        formula = [bm.speedup(b, x, r.kv) for x in xs]
        c.add(Series(formula_label(bm, b), xs, formula, "blue"))
        if gain:
            # the same read a step, each agent's cells once, for 1 + gain tokens an agent: the formula times that
            # (modeled; it leaves out the drafted rows' compute, which the measured points below carry)
            c.add(Series(f"with speculation, x{1 + gain:.2f} kept (modeled)", xs, [y * (1 + gain) for y in formula],
                         "magenta"))
        fit = Fit.from_record(r.fit) if r.fit else None
        if fit is not None:
            kv = r.kv  # the fit counts the KV tokens attention reads (fewer past a window)
            pts = [(x, y, fit.timed_at(b, t)) for x in xs
                   if (y := fit.speedup(b, t := bm.kv_equivalent_tokens(kv, x))) is not None]
            timed = [p for p in pts if p[2]]
            if timed:
                c.add(Series(f"calibrated (modeled, {fit_error_label(fit)})", [p[0] for p in timed],
                             [p[1] for p in timed], "green"))
            past = [p for p in pts if not p[2]]
            if past:  # where no step was timed the fit is a straight line carried on: said, and drawn apart
                c.add(Series("calibrated, extrapolated (no steps timed here)", [p[0] for p in past],
                             [p[1] for p in past], "bright_black", kind="dots"))
        pts = [p for p in stats.measured_points if p[2] == b]
        src = h.get("source", "")
        if pts:
            c.add(Series(f"{src}, B={b}", [p[0] for p in pts], [p[1] for p in pts], "orange1", kind="dots"))
        spec = [p for p in stats.spec_points if p[2] == b]
        if spec:
            c.add(Series(f"{src}, drafts verified", [p[0] for p in spec], [p[1] for p in spec], "magenta",
                         kind="dots"))
        if r.measured_speedup is not None:
            c.add(Series(f"now (B={r.batch})", [r.mean_context], [r.measured_speedup], "red", kind="marker"))
        full = stats.budget.forecast(h, stats.latest or r)
        if full is not None and 0 < full.full_at_context < limit:  # where the budget binds before the agents' limits
            ys = [top * i / 16 for i in range(17)]
            # first in the legend: a narrow plot cuts the legend's end
            c.series.insert(0, Series(full.text(), [full.full_at_context] * len(ys), ys, "yellow", kind="dots"))
        self.chart = c
        self.redraw()


class BytesPlot(TextLines):
    """Two bars, the shared and the private bytes per token, drawn as text: a plot library's fixed cost per
    frame (7 ms here) bought nothing for two numbers, and that time comes out of the engine's cores."""

    LABEL_COLUMNS = 17
    WRAP = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._title = ""
        self._bars: list[tuple[str, float, str]] = []
        self._footer = ""

    def show(self, stats: Stats) -> None:
        r = stats.latest_decode
        h = stats.header
        if r is None or not h or r.batch == 0:
            return
        bm = bytes_known(h, r.kv)
        if bm is None:
            self._title, self._bars, self._footer = NO_BYTES, [], ""
            self.redraw()
            return
        # per token generated: a verify step's kept drafts share its weight read and each agent's own KV read
        per_agent = r.tokens / r.batch if r.tokens > r.batch else 1.0
        per_token_w = r.weight_bytes / r.batch / per_agent
        per_token_private = bm.private_bytes_per_token(r.kv, r.mean_context) / per_agent
        private = "KV L·k private" if bm.is_dense else ("KV+state private" if bm.state_bytes else "KV K(L) private")
        cross = bm.crossover_context(r.batch, r.kv, r.distinct_experts
                                     if r.distinct_experts_source == "measured" else None)
        star = f"L*={cross:,.0f}" if math.isfinite(cross) else "L*: none"
        experts = f"; {r.distinct_experts:.0f}/{bm.n_expert} experts" if r.distinct_experts else ""
        self._title = f"MB/token at L={r.mean_context:,.0f}; {star}{experts}"
        self._bars = [("weights/B shared", per_token_w, "cyan"), (private, per_token_private, "magenta")]
        private_bytes = r.kv_bytes + (r.state_bytes or 0)
        self._footer = f"step: {human_bytes(r.weight_bytes)} shared + {human_bytes(private_bytes)} private"
        self.redraw()

    def text(self, width: int, height: int) -> Text:
        t = Text(self._title, style="bold")
        bar_w = max(4, width - self.LABEL_COLUMNS - 12)  # room for the figure after the bar
        top = max((v for _, v, _ in self._bars), default=0.0) or 1.0
        if self._bars:
            t.append("\n")
        for label, value, color in self._bars:
            t.append(f"\n{label:<{self.LABEL_COLUMNS}}")
            t.append("█" * max(1, round(bar_w * value / top)) if value > 0 else "", style=color)
            mb = value / 1e6
            t.append(f" {mb:,.0f} MB" if mb >= 100 else f" {mb:.3g} MB")
        if self._footer:
            t.append(f"\n\n{self._footer}", style="dim")
        return t


def fit_error_label(fit: Fit) -> str:
    """The step-time model's error as the screen states it: the median over steps it predicted before
    learning them (what a forecast would see), else the in-sample rms until it has predicted some."""
    if fit.median_error is not None and fit.checked:
        return f"step time {fit.median_error:.1%} median err"
    return f"step time {fit.rms_relative_error:.0%} rms err"

"""The plots: live batch, speedup vs context, the byte split. Plotext through textual-plotext."""

from textual_plotext import PlotextPlot

from engine.speedup import Fit, crossover_context, predicted_speedup
from tui.stats import Stats
from tui.widgets.status import human_bytes


class _Plot(PlotextPlot):
    def _fresh(self):
        """The plotext module, cleared for a new frame."""
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        return plt


class BatchPlot(_Plot):
    def show(self, stats: Stats) -> None:
        plt = self._fresh()
        h = list(stats.batch_history)
        if h:
            xs = [x[0] for x in h]
            top = max(max(x[2] for x in h), max(x[3] for x in h), 1)
            plt.plot(xs, [x[2] for x in h], label="cap", marker="braille", color="gray")
            plt.plot(xs, [x[3] for x in h], label="waiting/filling", marker="braille", color="orange")
            plt.plot(xs, [x[1] for x in h], label="batch", marker="braille", color="cyan")
            plt.ylim(0, top + 0.5)
            plt.yticks([0, top])  # plotext drops ticks unpredictably when short of rows
        plt.title("live batch per decode step")
        self.refresh()


NO_BYTES = "n/a: W and k unknown (--gguf, or --weight-bytes and --kv-bytes-per-token)"


def bytes_known(h: dict, kv: str) -> tuple[float, float] | None:
    w = h.get("weight_bytes") or 0
    k = (h.get("kv_bytes_per_token") or {}).get(kv) or 0
    return (w, k) if w and k else None


class SpeedupPlot(_Plot):
    def show(self, stats: Stats) -> None:
        plt = self._fresh()
        r = stats.latest_decode
        h = stats.header
        if r is None or not h:
            self.refresh()
            return
        known = bytes_known(h, r.kv_type)
        if known is None:
            plt.title("speedup " + NO_BYTES)
            self.refresh()
            return
        w, k = known
        limit = max((a.limit for a in r.agents), default=2048)
        xs = [limit * i / 40 for i in range(41)]
        b = max(r.batch_cap, 1)
        plt.plot(xs, [predicted_speedup(b, x, w, k) for x in xs], label=f"seed formula B={b} (modeled)",
                 marker="braille", color="blue")
        if r.fit:
            fit = Fit(r.fit[0], r.fit[1], r.fit[2], r.fit[3], 0)
            pts = [(x, y) for x in xs if (y := fit.speedup(b, x)) is not None]
            if pts:
                plt.plot([p[0] for p in pts], [p[1] for p in pts], marker="braille", color="green",
                         label=f"calibrated (modeled, {r.fit[3]:.0%} err)")
        pts = [p for p in stats.measured_points if p[2] == b]
        src = h.get("source", "")
        if pts:
            plt.scatter([p[0] for p in pts], [p[1] for p in pts], label=f"{src}, B={b}", marker="dot",
                        color="orange")
        if r.measured_speedup is not None:
            plt.scatter([r.mean_context], [r.measured_speedup], label=f"now (B={r.batch})", marker="@",
                        color="red")
        plt.ylim(0, b + 0.5)
        plt.title(f"speedup vs context per agent, KV {r.kv_type}")
        self.refresh()


class BytesPlot(_Plot):
    def show(self, stats: Stats) -> None:
        plt = self._fresh()
        r = stats.latest_decode
        h = stats.header
        if r is None or not h or r.batch == 0:
            self.refresh()
            return
        known = bytes_known(h, r.kv_type)
        if known is None:
            plt.title(NO_BYTES)
            self.refresh()
            return
        k = known[1]
        per_token_w = r.weight_bytes / r.batch
        per_token_kv = r.mean_context * k
        plt.bar(["weights/B shared", "KV L·k private"], [per_token_w / 1e6, per_token_kv / 1e6], orientation="h",
                width=0.5, color="cyan")
        cross = crossover_context(r.batch, h["weight_bytes"], k)
        plt.title(f"MB/token at L={r.mean_context:,.0f}; L*={cross:,.0f}")
        plt.xlabel(f"step: {human_bytes(r.weight_bytes)} shared + {human_bytes(r.kv_bytes)} private")
        self.refresh()

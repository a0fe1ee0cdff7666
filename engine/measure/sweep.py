"""Decode throughput over batch sizes x contexts, against the byte model's formula and the calibrated fit."""

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from swarmtune.engine.backends.backend import Backend
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.measure.power.meter import Meter
from swarmtune.engine.measure.probe import fill, time_decode
from swarmtune.engine.measure.speedup import predicted_speedup
from swarmtune.engine.measure.step_model import Calibration
from swarmtune.engine.model.bytes_model import ByteModel

CPU_DEFAULT_BATCHES = (1, 2, 4, 8)
CPU_DEFAULT_CONTEXTS = (64, 512, 2048)


@dataclass
class SweepRow:
    batch: int
    context: int
    tokens_per_second: float
    seconds_per_step: float
    speedup: float  # vs batch 1 at the same context, both timed in this sweep
    predicted_speedup: float  # the byte model's S(B, L) (modeled): windows, experts, recurrent state
    calibrated_speedup: float | None  # fit to this sweep's own timings (modeled)
    source: str  # measured | simulated
    watts: float | None = None
    joules_per_token: float | None = None
    tokens_per_joule: float | None = None
    power_source: str | None = None
    # the seed's formula with W = every weight byte and k = one token's KV over all layers (modeled): what a
    # dense reading of this model predicts; the same as predicted_speedup for a dense model
    dense_formula_speedup: float | None = None


@dataclass
class SweepResult:
    source: str
    model: str
    backend: str
    device: str
    kv_type: str
    weight_bytes: int
    kv_bytes_per_token: float
    rows: list[SweepRow]
    fit_rms_relative_error: float | None
    copy_check: dict[str, float] | None = None
    fit_median_relative_error: float | None = None  # median |predicted / measured - 1| of step time over the grid
    bytes_model: dict[str, Any] = field(default_factory=dict)  # ByteModel.to_dict(): what the predicted column assumes

    @property
    def kv(self) -> KVSetting:
        """kv_type, the spelling the result's JSON holds, as the setting."""
        return KVSetting.parse(self.kv_type)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    def byte_model(self) -> ByteModel:
        if self.bytes_model:
            return ByteModel.from_dict(self.bytes_model)
        # an older result: W and k at its own cache type
        return ByteModel.dense(self.weight_bytes, self.kv_bytes_per_token / self.kv.bytes_for(1))


def pace(batch: int, context: int, bm: ByteModel, kv: KVSetting, measured: float | None = None,
         predicted: float | None = None) -> str:
    if measured is not None and predicted is not None and measured < 0.6 * predicted:
        return "compute per token: the bandwidth formula misses it"
    private = batch * bm.private_bytes_per_token(kv, context)
    if private == 0:
        return "pure weight stream, perfectly shared"
    ratio = private / bm.weight_bytes(batch)  # private read (KV, state) over the shared weight read, per step
    if bm.has_swa and context > 0 and bm.kv_read_bytes(kv, 2 * context) < 1.01 * bm.kv_read_bytes(kv, context):
        return "KV read capped by the windows: batching keeps its share"
    if ratio < 0.8:
        return "weights still dominate the per-token cost"
    if ratio <= 1.25:
        return "KV read about equals weight read"
    if ratio < 2.5:
        return "private KV is now the larger half"
    if ratio < 8:
        return f"KV read is about {ratio:.0f}x the shared weights"
    return "almost pure per-agent KV, batch barely helps"


def run_sweep(backend: Backend, kv: KVSetting, batches: list[int], contexts: list[int], steps: int = 8,
              check_copy: bool = False, meter: Meter | None = None,
              progress: Callable[[int, int], None] | None = None) -> SweepResult:
    batches = sorted(set(batches) | {1})
    facts = backend.facts
    bm = facts.bytes_model
    assert bm is not None  # ModelFacts always carries one
    k = facts.kv_bytes_per_token(kv)
    w_all = bm.all_weight_bytes + bm.embd_row_bytes  # every weight byte a dense reading would stream
    ctx_per_seq = ((max(contexts) + steps + 8 + 255) // 256) * 256
    backend.open(kv, max(batches), ctx_per_seq)
    timings = {}
    total, done = len(batches) * len(contexts), 0
    for c in contexts:
        fill(backend, 1, c)
        for b in batches:
            if progress:
                progress(done, total)
            timings[(b, c)] = time_decode(backend, b, c, steps=steps, warmup=2, filled=True)
            done += 1
        for s in range(max(batches)):
            backend.cells.drop(s)
    if progress:
        progress(total, total)
    cal = Calibration()
    for (b, c), t in timings.items():
        cal.add(b, b * bm.kv_equivalent_tokens(kv, c + 1), t.seconds_per_step, pinned=True)
    fit = cal.refit()
    rows = []
    for c in contexts:
        base = timings[(1, c)].tokens_per_second
        for b in batches:
            t = timings[(b, c)]
            row = SweepRow(
                batch=b, context=c, tokens_per_second=t.tokens_per_second, seconds_per_step=t.seconds_per_step,
                speedup=t.tokens_per_second / base, predicted_speedup=bm.speedup(b, c, kv),
                calibrated_speedup=fit.speedup(b, bm.kv_equivalent_tokens(kv, c)) if fit else None,
                source=backend.source,
                dense_formula_speedup=predicted_speedup(b, c, w_all, k),
            )
            if meter is not None:
                # a sensor over the timed steps' wall span (measured), or the profile's model (modeled)
                p = meter.step(t.started_s, t.ended_s, b, t.seconds_per_step)
                if p is not None and p.watts > 0:
                    row.watts, row.power_source = p.watts, p.source
                    row.joules_per_token = p.watts / t.tokens_per_second
                    row.tokens_per_joule = 1 / row.joules_per_token
            rows.append(row)
    copy_check = None
    if check_copy:
        b, c = max(batches), max(contexts)
        separate = time_decode(backend, b, c, steps=steps, warmup=2, copy=False)
        copied = timings[(b, c)]
        copy_check = {"batch": b, "context": c, "copied_seconds_per_step": copied.seconds_per_step,
                      "separate_seconds_per_step": separate.seconds_per_step,
                      "ratio": copied.seconds_per_step / separate.seconds_per_step}
    return SweepResult(
        source=backend.source, model=facts.name, backend=backend.info.name, device=backend.info.device,
        kv_type=kv.label, weight_bytes=facts.weight_bytes, kv_bytes_per_token=k, rows=rows,
        fit_rms_relative_error=fit.rms_relative_error if fit else None, copy_check=copy_check,
        fit_median_relative_error=cal.in_sample_median_error(),
        bytes_model=bm.to_dict(),
    )


def table_columns(result: SweepResult) -> list[str]:
    bmax = max(r.batch for r in result.rows)
    bm = result.byte_model()
    cols = ["context per agent", f"tok/s at {bmax}", f"{bmax}-agent speedup ({result.source})"]
    if bm.is_dense:
        cols.append("seed formula (modeled)")
    else:
        cols += [f"bytes model: {bm.kind} (modeled)", "dense formula (modeled)"]
    return cols + ["calibrated (modeled)", "what sets the pace"]


def table_rows(result: SweepResult) -> list[list[str]]:
    """The seed's table: one line per context at the largest batch (columns: table_columns)."""
    bmax = max(r.batch for r in result.rows)
    bm = result.byte_model()
    out = []
    for r in (r for r in result.rows if r.batch == bmax):
        row = [f"{r.context:,}", f"{r.tokens_per_second:,.1f}", f"{r.speedup:.2f}x", f"{r.predicted_speedup:.2f}x"]
        if not bm.is_dense:
            row.append(f"{r.dense_formula_speedup:.2f}x" if r.dense_formula_speedup is not None else "n/a")
        row += [f"{r.calibrated_speedup:.2f}x" if r.calibrated_speedup is not None else "n/a",
                pace(bmax, r.context, bm, result.kv, r.speedup, r.predicted_speedup)]
        out.append(row)
    return out


def crossover_note(result: SweepResult) -> str:
    """L* at the largest batch, from the byte model (modeled)."""
    bmax = max(r.batch for r in result.rows)
    cross = result.byte_model().crossover_context(bmax, result.kv)
    if math.isinf(cross):
        return f"L* at B={bmax}: none (the private read never reaches the shared one: windows cap the KV read)"
    return f"L* at B={bmax}: {cross:,.0f} tokens, where a token's private read equals its share of the weights"


def energy_rows(result: SweepResult) -> list[list[str]]:
    out = []
    for r in result.rows:
        if r.watts is None:
            continue
        out.append([f"{r.batch}", f"{r.context:,}", f"{r.tokens_per_second:,.1f}", f"{r.watts:.0f}",
                    f"{r.joules_per_token:.2f}", f"{r.tokens_per_joule:.2f}", r.power_source or ""])
    return out


def write_png(result: SweepResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=110)
    label = result.source
    bm = result.byte_model()
    formula = "seed formula" if bm.is_dense else f"bytes model, {bm.kind}"
    for b in sorted({r.batch for r in result.rows} - {1}):
        rows = [r for r in result.rows if r.batch == b]
        xs = [r.context for r in rows]
        line = ax.plot(xs, [r.speedup for r in rows], "o-", label=f"B={b} {label}")[0]
        ax.plot(xs, [r.predicted_speedup for r in rows], "--", color=line.get_color(), alpha=0.6,
                label=f"B={b} {formula} (modeled)")
        if not bm.is_dense and rows[0].dense_formula_speedup is not None:
            dense = [math.nan if r.dense_formula_speedup is None else r.dense_formula_speedup for r in rows]
            ax.plot(xs, dense, "-.", color="grey", alpha=0.5,
                    label=f"B={b} dense formula (modeled)")
        if rows[0].calibrated_speedup is not None:
            cal = [r.calibrated_speedup if r.calibrated_speedup is not None else float("nan") for r in rows]
            ax.plot(xs, cal, ":", color=line.get_color(),
                    label=f"B={b} calibrated (modeled)")
    bmax = max(r.batch for r in result.rows)
    cross = bm.crossover_context(bmax, result.kv)
    if math.isfinite(cross) and cross > 0:
        ax.axvline(cross, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("context per agent (tokens)")
    ax.set_ylabel("speedup vs batch 1")
    ax.set_title(f"{result.model}, KV {result.kv_type} ({result.source})")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)

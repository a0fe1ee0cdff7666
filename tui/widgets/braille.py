"""A line and scatter chart drawn in braille as one Rich Text: the dashboard's plots.

Plotext (through textual-plotext) cost 52 ms a frame here for the live batch and 28 ms for the speedup
curve: it builds a character matrix, writes it out as ANSI, and Rich parses the ANSI back. On a 2-core box
those milliseconds come out of the engine's decode (every slice the UI takes stalls a step at its next
barrier), and they were half of the dashboard's overhead. Drawing the few hundred points straight into
styled cells costs a few milliseconds."""

from dataclasses import dataclass, field

from rich.text import Text

# braille dot bits by (column 0-1, row 0-3) inside a cell
_DOTS = ((0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80))
_BLANK = 0x2800


@dataclass
class Series:
    label: str
    xs: list[float]
    ys: list[float]
    color: str
    kind: str = "line"  # line | dots | marker (one character per point)
    marker: str = "@"


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 10 or v == int(v) else f"{v:.1f}"


@dataclass
class Chart:
    """A chart of some series over fixed x and y ranges, rendered to a width and height in cells."""

    title: str = ""
    series: list[Series] = field(default_factory=list)
    x_range: tuple[float, float] | None = None  # by default the data's
    y_range: tuple[float, float] | None = None
    y_ticks: tuple[float, ...] = ()

    def add(self, s: Series) -> None:
        self.series.append(s)

    def _ranges(self) -> tuple[float, float, float, float]:
        xs = [x for s in self.series for x in s.xs]
        ys = [y for s in self.series for y in s.ys]
        x0, x1 = self.x_range or ((min(xs), max(xs)) if xs else (0.0, 1.0))
        y0, y1 = self.y_range or ((min(ys), max(ys)) if ys else (0.0, 1.0))
        # a span too small to divide by (a denormal apart) is a flat line, as an empty one is
        if not x1 - x0 > 1e-12 * max(1.0, abs(x0), abs(x1)):
            x1 = x0 + 1.0
        if not y1 - y0 > 1e-12 * max(1.0, abs(y0), abs(y1)):
            y1 = y0 + 1.0
        return x0, x1, y0, y1

    def render(self, width: int, height: int) -> Text:
        out = Text()
        out.append(self.title[:width].center(width), style="bold")
        rows = height - 3  # the title, the x axis and the legend
        if rows < 1 or width < 12:
            return out
        x0, x1, y0, y1 = self._ranges()
        ticks = {t: _fmt(t) for t in self.y_ticks}
        margin = max((len(v) for v in ticks.values()), default=1) + 1
        cols = width - margin - 1
        if cols < 4:
            return out
        bits = [[0] * cols for _ in range(rows)]
        color: list[list[str | None]] = [[None] * cols for _ in range(rows)]
        chars: dict[tuple[int, int], str] = {}
        nx, ny = 2 * cols - 1, 4 * rows - 1

        def dot(px: float, py: float, c: str) -> None:
            ix, iy = round(px), round(py)
            if 0 <= ix <= nx and 0 <= iy <= ny:
                r, k = iy // 4, ix // 2
                bits[r][k] |= _DOTS[ix % 2][iy % 4]
                color[r][k] = c

        def place(x: float, y: float) -> tuple[float, float]:
            return (x - x0) / (x1 - x0) * nx, (1 - (y - y0) / (y1 - y0)) * ny

        for s in self.series:
            pts = [place(x, y) for x, y in zip(s.xs, s.ys, strict=False)]
            if s.kind == "marker":
                for px, py in pts:
                    r, k = round(py) // 4, round(px) // 2
                    if 0 <= r < rows and 0 <= k < cols:
                        chars[(r, k)] = s.marker
                        color[r][k] = s.color
                continue
            for i, (px, py) in enumerate(pts):
                dot(px, py, s.color)
                if s.kind == "line" and i:
                    qx, qy = pts[i - 1]
                    n = int(max(abs(px - qx), abs(py - qy)))
                    for j in range(1, n):
                        dot(qx + (px - qx) * j / n, qy + (py - qy) * j / n, s.color)
        tick_row = {min(rows - 1, max(0, round((1 - (t - y0) / (y1 - y0)) * ny) // 4)): v for t, v in ticks.items()}
        for r in range(rows):
            out.append("\n")
            out.append(tick_row.get(r, "").rjust(margin - 1) + " ", style="dim")
            out.append("│", style="dim")
            run, style = "", None
            for k in range(cols):
                ch = chars.get((r, k)) or (chr(_BLANK + bits[r][k]) if bits[r][k] else " ")
                c = color[r][k]
                if c != style and run:
                    out.append(run, style=style)
                    run = ""
                run, style = run + ch, c
            out.append(run, style=style)
        lo, hi = _fmt(x0), _fmt(x1)
        axis = " " * (margin + 1) + lo + hi.rjust(max(cols - len(lo), len(hi) + 1))
        out.append("\n" + axis[:width], style="dim")
        out.append("\n")
        legend = Text()
        for s in self.series:
            if not s.label:
                continue
            sign = s.marker if s.kind == "marker" else "━━" if s.kind == "line" else "··"
            legend.append(sign + " ", style=s.color)
            legend.append(s.label + "  ")
        legend.truncate(width)
        out.append_text(legend)
        return out

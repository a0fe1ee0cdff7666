"""The dashboard's braille charts: points land where their values say, inside the widget's cells."""

from hypothesis import given, settings
from hypothesis import strategies as st

from swarmtune.tui.widgets.braille import Chart, Series


def rows(c: Chart, w: int, h: int) -> list[str]:
    return c.render(w, h).plain.split("\n")


def test_a_rising_line_runs_from_the_bottom_left_to_the_top_right():
    c = Chart(title="t", x_range=(0, 10), y_range=(0, 10), y_ticks=(0, 10))
    c.add(Series("up", [0, 10], [0, 10], "cyan"))
    lines = rows(c, 40, 12)
    plot = lines[1:-2]
    assert len(lines) == 12 and all(len(x) <= 40 for x in lines)
    assert plot[0].startswith("10 │") and plot[-1].startswith(" 0 │")
    first = [i for i, ch in enumerate(plot[0]) if ch.strip() and i > 3]
    last = [i for i, ch in enumerate(plot[-1]) if ch.strip() and i > 3]
    assert min(last) < max(first)  # the bottom row's dots are left of the top row's
    assert "━━ up" in lines[-1] and lines[-2].strip().startswith("0") and lines[-2].rstrip().endswith("10")


def test_a_marker_is_its_own_character():
    c = Chart(x_range=(0, 1), y_range=(0, 1))
    c.add(Series("now", [0.5], [0.5], "red", kind="marker"))
    assert "@" in c.render(30, 10).plain


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(-1e6, 1e6), st.floats(-1e6, 1e6)), max_size=50),
       st.integers(1, 120), st.integers(1, 40))
def test_any_data_at_any_size_stays_inside_its_cells(points, w, h):
    c = Chart(title="a title longer than some widths", y_ticks=(0, 1))
    c.add(Series("s", [p[0] for p in points], [p[1] for p in points], "cyan"))
    lines = rows(c, w, h)
    assert len(lines) <= max(h, 1) and all(len(x) <= w for x in lines)


def test_a_span_too_small_to_divide_by_is_a_flat_line():
    # hypothesis found y values 0 and 5e-324: 1 / 5e-324 is infinity, and rounding it raised OverflowError
    c = Chart(title="t", y_ticks=(0, 1))
    c.add(Series("s", [0.0, 1.0], [0.0, 5e-324], "cyan"))
    lines = rows(c, 40, 10)
    assert len(lines) <= 10 and all(len(x) <= 40 for x in lines)


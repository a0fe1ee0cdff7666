"""A widget drawn line by line (Textual's line API) from rich Text made for its size."""

from rich.text import Text
from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget


class TextLines(Widget):
    """A widget drawn through Textual's line API from rich Text made for its size: each line's segments
    straight to a strip, once per show() or resize. Textual's general path for a rendered Text (convert to
    its Content, wrap, cut into strips, on every paint) cost 15 ms a frame for a chart whose Text took 3 ms
    to make, and on a small CPU that time is taken from the engine's decode."""

    WRAP = False  # fold lines longer than the width (a chart's lines are made to fit and never need it)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._strips: list[Strip] = []
        self._drawn_for: Size | None = None  # the size the strips were made for; None: make them again

    def text(self, width: int, height: int) -> Text:
        raise NotImplementedError

    def redraw(self) -> None:
        self._drawn_for = None
        self.refresh()

    def render_line(self, y: int) -> Strip:
        size = self.size
        if self._drawn_for != size:
            console, base = self.app.console, self.rich_style  # the widget's own colours under the text's
            text = self.text(size.width, size.height)
            lines = text.wrap(console, size.width) if self.WRAP else text.split("\n", allow_blank=True)
            self._strips = [Strip(list(line.render(console))).apply_style(base).crop_extend(0, size.width, base)
                            for line in lines]
            self._drawn_for = size
        return self._strips[y] if y < len(self._strips) else Strip.blank(size.width, self.rich_style)

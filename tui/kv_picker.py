"""A small modal list of the KV cache settings (a type, or K/V apart); picking one switches the engine to it."""

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from swarmtune.engine.kv.types import KV_TYPES, MIXED_KV, KVSetting

CHOICES = (*(KVSetting(t, t) for t in KV_TYPES.values()), *MIXED_KV)


class KVPicker(ModalScreen[KVSetting | None]):
    DEFAULT_CSS = """
    KVPicker { align: center middle; }
    KVPicker > OptionList { width: 48; height: auto; max-height: 14; border: round $accent; }
    """
    BINDINGS = [Binding("escape", "dismiss(None)", "close")]

    def __init__(self, current: KVSetting | None, bytes_per_token: dict[str, float]) -> None:
        super().__init__()
        self.current = current
        self.bytes_per_token = bytes_per_token

    def compose(self) -> ComposeResult:
        opts = []
        for setting in CHOICES:
            name = setting.label
            # the header's bytes per token are per type, K and V alike
            per = [x for x in (self.bytes_per_token.get(setting.k.name), self.bytes_per_token.get(setting.v.name)) if x]
            # K and V apart: half the bytes at each type (the byte model counts each head's share exactly)
            k = sum(per) / 2 if len(per) == 2 else None
            label = f"{name:10} {k / 1e3:9,.1f} KB/token" if k else name
            opts.append(Option(label + ("  (now)" if setting == self.current else ""), id=name))
        ol = OptionList(*opts)
        ol.border_title = "KV cache: a type, or K/V"
        yield ol

    def on_mount(self) -> None:
        ol = self.query_one(OptionList)
        ol.highlighted = CHOICES.index(self.current) if self.current in CHOICES else 0
        ol.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(next((c for c in CHOICES if c.label == event.option.id), None))

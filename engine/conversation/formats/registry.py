"""Which format a model writes, picked from its chat template's own markers, as llama.cpp's server picks a
parser from the template it loads. A template none of them matches is read as Hermes (what swarmtune offers
a template that has no tools of its own), and the request's record says so."""

from dataclasses import dataclass

from swarmtune.engine.conversation.formats.base import Format
from swarmtune.engine.conversation.formats.deepseek import DeepSeek
from swarmtune.engine.conversation.formats.gemma4 import Gemma4
from swarmtune.engine.conversation.formats.glm import Glm
from swarmtune.engine.conversation.formats.harmony import Harmony
from swarmtune.engine.conversation.formats.hermes import Hermes
from swarmtune.engine.conversation.formats.kimi import Kimi
from swarmtune.engine.conversation.formats.llama3 import Llama3
from swarmtune.engine.conversation.formats.mistral import Mistral
from swarmtune.engine.conversation.formats.qwen_xml import QwenXml

# the most specific first: Qwen3-Coder's and GLM's templates also write <tool_call>, Hermes' marker
FAMILIES: tuple[type[Format], ...] = (Harmony, Gemma4, Kimi, DeepSeek, Glm, QwenXml, Mistral, Llama3, Hermes)


@dataclass(frozen=True)
class Picked:
    fmt: Format
    known: bool  # False: no family's markers are in the template; read as Hermes

    @property
    def label(self) -> str:
        return self.fmt.name if self.known else f"unknown (read as {self.fmt.name})"


def pick(template_source: str) -> Picked:
    for family in FAMILIES:
        fmt = family.for_template(template_source)
        if fmt is not None:
            return Picked(fmt, True)
    return Picked(Hermes(), False)

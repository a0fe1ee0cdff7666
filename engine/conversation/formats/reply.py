"""What a reply parses to, and what a parse needs to know of the request: the shared types of every format."""

import uuid
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object, as text (what OpenAI's `function.arguments` holds)
    id: str

    def to_openai(self, index: int) -> dict[str, Any]:
        return {"index": index, "id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass(frozen=True)
class Reply:
    """A reply as the client sees it. content and reasoning are verbatim text, in order; calls are whole."""

    content: str = ""
    reasoning: str = ""
    calls: tuple[ToolCall, ...] = ()
    broken: str = ""  # why a call the model began did not parse ("" where none did): the text stays content


@dataclass(frozen=True)
class ReplyContext:
    """What a parse needs of the request besides the reply's text.

    prompt_tail: the end of the rendered prompt (its generation prompt): a template that opens the thinking
    block itself (`<think>\\n`) leaves the reply starting inside it, as llama.cpp's thinking_forced_open.
    reasoning: False under --reasoning-format none: the reasoning stays in content, tags and all.
    tools: the offered tools (OpenAI's shape); their schemas cast the arguments of text-valued formats.
    calls: False where the request offered no tools: a call the model writes anyway stays content."""

    prompt_tail: str = ""
    reasoning: bool = True
    tools: tuple[dict[str, Any], ...] = field(default=())
    calls: bool = True

    def schema(self, name: str) -> dict[str, Any] | None:
        """The parameters schema of the tool called `name`, or None where it is not offered."""
        for t in self.tools:
            fn = t.get("function", t)
            if fn.get("name") == name:
                params = fn.get("parameters")
                return params if isinstance(params, dict) else {}
        return None

    def param_schema(self, name: str, param: str) -> dict[str, Any] | None:
        schema = self.schema(name) or {}
        props = schema.get("properties")
        found = props.get(param) if isinstance(props, dict) else None
        return found if isinstance(found, dict) else None

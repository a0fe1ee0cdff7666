"""A model's own chat template (the GGUF's `tokenizer.chat_template`, Jinja) rendered as llama.cpp's
`--jinja` and Hugging Face's tokenizers render it: a sandboxed Jinja environment, blocks trimmed, the
helpers templates call (`raise_exception`, `strftime_now`), `tools` passed in where a request has them.
What llama.cpp's own Jinja accepts, this does too: `{% break %}`, Hugging Face's `{% generation %}`, a list
a template builds with `append`, a missing field read as nothing; and its context: `date_string` and
`datetime` of today, `enable_thinking` true unless a request says otherwise (llama-server's default).

A template that does not mention tools still gets them: they go into the system message in the
Hermes format (`<tools>` with their JSON schemas, calls as `<tool_call>` JSON), which is what Qwen's
and Hermes' own templates write, and what small models imitate best (engine/conversation/tool_calls.py parses it)."""

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.parser import Parser
from jinja2.sandbox import SandboxedEnvironment

from swarmtune.engine.errors import UserError


class TemplateError(UserError):
    """The template refused the conversation (its own raise_exception), or could not be rendered."""


def _raise(message: str) -> None:
    raise TemplateError(f"the model's chat template refused this conversation: {message}")


class Generation(Extension):
    """`{% generation %}…{% endgeneration %}`: Hugging Face marks the assistant's tokens with it (for training
    masks); rendering keeps what it encloses, as llama.cpp's Jinja does."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, **_: Any) -> str:
    """JSON text; a generator or a mapping view is a list, as in llama.cpp's Jinja."""
    def plain(v: Any) -> Any:
        if isinstance(v, Mapping):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)) or (hasattr(v, "__iter__") and not isinstance(v, (str, bytes))):
            return [plain(x) for x in v]
        return v

    return json.dumps(plain(value), indent=indent, ensure_ascii=ensure_ascii)


class _Missing(jinja2.ChainableUndefined):
    """A missing field, as llama.cpp's Jinja reads one: nothing, also when text is added to it."""

    def __add__(self, other: Any) -> Any:
        return other

    def __radd__(self, other: Any) -> Any:
        return other


# mutable lists (templates `append` to them, as llama.cpp's Jinja lets them); still no access to Python's
# internals. A missing field is nothing, and so is a field of it, as in llama.cpp's Jinja.
_ENV = SandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, undefined=_Missing,
                            extensions=["jinja2.ext.loopcontrols", Generation])
_ENV.globals.update(raise_exception=_raise, strftime_now=lambda fmt: datetime.now().strftime(fmt))
_ENV.filters["tojson"] = _tojson
# nothing is HTML here: `|safe` is plain text (Jinja's Markup would escape what is added to it, `"…"|safe + x`)
_ENV.filters["safe"] = str


def tool_preamble(tools: list[dict[str, Any]]) -> str:
    """The Hermes / Qwen system text that offers tools to a model whose template does not."""
    listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            f"{listed}\n</tools>\n\nFor each function call, return a json object with function name and "
            "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


RESERVED = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"})


class ChatTemplate:
    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        try:
            self.template = _ENV.from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise UserError(f"the model's chat template does not parse: {e.message} (line {e.lineno})") from None
        self.source = source
        self.bos_token, self.eos_token = bos_token, eos_token
        self.knows_tools = "tools" in source

    def render(self, messages: Sequence[Mapping[str, Any]], tools: list[dict[str, Any]] | None = None,
               add_generation_prompt: bool = True, variables: Mapping[str, Any] | None = None) -> str:
        """variables: what a request adds to the template's context (`chat_template_kwargs`, `enable_thinking`,
        `reasoning_effort`), as llama-server adds them; a template that does not read one ignores it. They
        cannot replace the conversation itself."""
        msgs = messages
        if tools and not self.knows_tools:
            msgs = with_tools_in_system(messages, tools)
        now = datetime.now()
        extra = {"date_string": now.strftime("%d %b %Y"), "datetime": now.strftime("%b %d %Y"),
                 "enable_thinking": True}
        extra.update({k: v for k, v in (variables or {}).items() if k not in RESERVED})
        try:
            return self.template.render(**extra, messages=msgs, tools=tools if self.knows_tools else None,
                                        add_generation_prompt=add_generation_prompt, bos_token=self.bos_token,
                                        eos_token=self.eos_token)
        except TemplateError:
            raise
        except (jinja2.TemplateError, TypeError, KeyError, ValueError) as e:
            raise TemplateError(f"the model's chat template could not render this conversation: {e}") from None


def with_tools_in_system(messages: Sequence[Mapping[str, Any]],
                         tools: list[dict[str, Any]]) -> list[Mapping[str, Any]]:
    pre = tool_preamble(tools)
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{pre}"}, *messages[1:]]
    return [{"role": "system", "content": pre}, *messages]

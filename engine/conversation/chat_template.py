"""A model's own chat template (the GGUF's `tokenizer.chat_template`, Jinja) rendered as llama.cpp's
`--jinja` and Hugging Face's tokenizers render it: a sandboxed Jinja environment, blocks trimmed, the
helpers templates call (`raise_exception`, `strftime_now`), `tools` passed in where a request has them.

A template that does not mention tools still gets them: they go into the system message in the
Hermes format (`<tools>` with their JSON schemas, calls as `<tool_call>` JSON), which is what Qwen's
and Hermes' own templates write, and what small models imitate best (engine/conversation/tool_calls.py parses it)."""

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from swarmtune.engine.errors import UserError


class TemplateError(UserError):
    """The template refused the conversation (its own raise_exception), or could not be rendered."""


def _raise(message: str) -> None:
    raise TemplateError(f"the model's chat template refused this conversation: {message}")


_ENV = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.Undefined)
_ENV.globals.update(raise_exception=_raise, strftime_now=lambda fmt: datetime.now().strftime(fmt))
_ENV.filters["tojson"] = lambda v, indent=None, ensure_ascii=False, **kw: json.dumps(v, indent=indent,
                                                                                    ensure_ascii=ensure_ascii)


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
        extra = {k: v for k, v in (variables or {}).items() if k not in RESERVED}
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

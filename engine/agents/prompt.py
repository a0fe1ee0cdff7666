"""A served conversation's messages (any API's, normalised) to the prompt text the model reads.

Normalised messages: engine/conversation/chat_message.py's ChatMessage. The model's own Jinja template renders
them where the GGUF has one, or `--chat-template-file` gives one (with the calls, results and earlier reasoning
in the structure Hugging Face templates expect, for a template that knows tools; written into the text in the
Hermes format, for one that does not); the backend's built-in rendering otherwise (the simulated backend's
ChatML). The template also says which family's format the replies are read in
(engine/conversation/formats/registry.py)."""

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from swarmtune.engine.backends.backend import Backend
from swarmtune.engine.conversation.chat_message import ChatMessage
from swarmtune.engine.conversation.chat_template import ChatTemplate, with_tools_in_system
from swarmtune.engine.conversation.formats.registry import pick
from swarmtune.engine.conversation.formats.reply import ToolCall
from swarmtune.engine.conversation.tool_calls import render_call, render_result


class PromptRenderer:
    def __init__(self, backend: Backend, template_source: str | None = None) -> None:
        """template_source: a template that replaces the GGUF's (--chat-template-file)."""
        self.backend = backend
        src = template_source if template_source is not None else backend.text.jinja_template
        text = backend.text
        self.template = ChatTemplate(src, text.special_text("bos"), text.special_text("eos")) if src else None
        self.picked = pick(src or "")
        self.family = self.picked.fmt.name
        self.how = ("--chat-template-file (Jinja)" if template_source is not None else
                    "the model's own (GGUF tokenizer.chat_template, Jinja)" if src else "built in (ChatML)")

    def render(self, messages: list[ChatMessage], tools: list[dict[str, Any]] | None = None,
               variables: Mapping[str, Any] | None = None) -> str:
        """variables: the request's additions to the template's context (enable_thinking, reasoning_effort,
        chat_template_kwargs); the built-in rendering has none to read."""
        if self.template is not None and self.template.knows_tools:
            return self.template.render([self._structured(m, self.family) for m in messages], tools,
                                        variables=variables)
        flat = [self._flat(m, wrap_results=bool(tools)) for m in messages]
        if self.template is not None:
            return self.template.render(flat, tools, variables=variables)
        shown: Sequence[Mapping[str, Any]] = with_tools_in_system(flat, tools) if tools else flat
        return self.backend.text.chat([{"role": m["role"], "content": m["content"]} for m in shown], add_assistant=True)

    def _flat(self, m: ChatMessage, wrap_results: bool) -> dict[str, Any]:
        """Calls and results written into the text, in the format swarmtune offers such a template. A tool
        message of a request without tools stays as it came (as llama-server renders it): only the offered
        format wraps results in tags."""
        content = m.get("content") or ""
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = "\n".join(render_call(self.family, c.name, c.arguments) for c in m["tool_calls"])
            content = f"{content}\n{calls}" if content else calls
        elif m["role"] == "tool" and wrap_results:
            content = render_result(content)
        return {"role": m["role"], "content": content}

    @staticmethod
    def _structured(m: ChatMessage, fam: str) -> dict[str, Any]:
        out: dict[str, Any] = {"role": m["role"], "content": m.get("content") or ""}
        calls: list[ToolCall] = m.get("tool_calls") or []
        ident = _mistral_id if fam == "mistral" else (lambda i: i)
        if calls:
            out["tool_calls"] = [{"type": "function", "id": ident(c.id),
                                  "function": {"name": c.name, "arguments": _as_object(c.arguments)}}
                                 for c in calls]
        if m.get("tool_call_id"):
            out["tool_call_id"] = ident(m["tool_call_id"])
        if m.get("reasoning"):
            # as llama-server passes it: Qwen's, GLM's, Kimi's and DeepSeek's templates read reasoning_content,
            # gpt-oss's reads thinking; each decides which turns keep it
            out["reasoning_content"] = out["thinking"] = m["reasoning"]
        return out


def _mistral_id(call_id: str) -> str:
    """Mistral's templates refuse a call id that is not 9 letters and digits; a client's id maps to one,
    the same for the call and its result."""
    if len(call_id) == 9 and call_id.isalnum():
        return call_id
    return hashlib.sha1(call_id.encode()).hexdigest()[:9]


def _as_object(arguments: str) -> Any:
    """Templates index a call's arguments as a mapping (Hugging Face's convention); clients send text."""
    try:
        return json.loads(arguments) if arguments else {}
    except json.JSONDecodeError:
        return arguments

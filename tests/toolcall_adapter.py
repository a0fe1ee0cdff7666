"""swarmtune's adapter for the canitoolcall conformance suite: every fixture's recorded reply replayed
through swarmtune's own parsing (engine/conversation/formats/), whole and streamed.

The fixtures carry text and token ids of Hugging Face tokenizers, which these machines cannot download, so
the units streamed are the reply's characters: every split a tokenizer could make, and more. The format is
picked as the server picks it, from the model's template: the one llama.cpp's pinned sdist vendors.

    canitoolcall run --engine toolcall_adapter:Swarmtune --python "$(which python)" --env PYTHONPATH=tests
(bench/tool_families.py runs it so)."""

from collections.abc import Sequence
from typing import Any

from canitoolcall.adapters.base import Adapter, ReplayInput, Support, ToolSpec
from canitoolcall.results import ParsedToolCall, ParseResult, StreamAccumulator
from llama_templates import template

import swarmtune
from swarmtune.engine.conversation.formats.base import Format
from swarmtune.engine.conversation.formats.registry import pick
from swarmtune.engine.conversation.formats.reply import ReplyContext
from swarmtune.engine.conversation.formats.stream import ReplyStream

# family -> (a piece of the reference model's name, the template in models/templates/), the first match wins
TEMPLATES: dict[str, list[tuple[str, str]]] = {
    "qwen3-hermes": [("", "Qwen-Qwen3-0.6B.jinja")],
    "qwen3-xml": [("Coder", "Qwen3-Coder.jinja"), ("", "Qwen3.5-4B.jinja")],
    "llama": [("", "meta-llama-Llama-3.3-70B-Instruct.jinja")],
    "mistral": [("Devstral", "unsloth-mistral-Devstral-Small-2507.jinja"),
                ("Reasoning", "mistralai-Ministral-3-14B-Reasoning-2512.jinja"),
                ("Magistral", "mistralai-Ministral-3-14B-Reasoning-2512.jinja"),
                ("Mistral-7B", "mistralai-Mistral-Nemo-Instruct-2407.jinja"),
                ("", "Mistral-Small-3.2-24B-Instruct-2506.jinja")],
    "deepseek": [("V3.1", "deepseek-ai-DeepSeek-V3.1.jinja"), ("V3.2", "deepseek-ai-DeepSeek-V3.2.jinja"),
                 ("V4.1", "deepseek-ai-DeepSeek-V4-Flash-0731.jinja"), ("V4", "deepseek-ai-DeepSeek-V4.jinja"),
                 ("", "llama-cpp-deepseek-r1.jinja")],  # V3, V3-0324, R1: the fenced-JSON format
    "gpt-oss": [("", "openai-gpt-oss-120b.jinja")],
    "gemma4": [("", "google-gemma-4-31B-it.jinja")],
    "glm": [("GLM-4.5", "GLM-4.6.jinja"), ("", "GLM-4.7-Flash.jinja")],
    "kimi": [("K3", "Kimi-K3.jinja"), ("K2.6", "Kimi-K2-Thinking.jinja"), ("", "Kimi-K2-Instruct.jinja")],
}


def template_for(family: str, model: str) -> str | None:
    return next((t for piece, t in TEMPLATES.get(family, []) if piece in model), None)


def _result(content: str, reasoning: str, calls: Sequence[Any]) -> ParseResult:
    return ParseResult(content=content or None, reasoning_content=reasoning or None,
                       tool_calls=tuple(ParsedToolCall(c.name, c.arguments) for c in calls))


class Swarmtune(Adapter):
    name = "swarmtune"
    pinned_version = swarmtune.__version__
    supports_text_deltas = True
    tokens_per_step = "many"  # speculation sends several tokens in one delta: every split counts

    def version(self) -> str:
        return swarmtune.__version__

    def supports(self, family: str, model: str) -> Support:
        t = template_for(family, model)
        return Support(True) if t else Support(False, f"no template in the pinned llama.cpp for {family}")

    def _setup(self, raw: ReplayInput, tools: Sequence[ToolSpec]) -> tuple[Format, ReplyContext, str]:
        name = template_for(raw.family, raw.model)
        assert name is not None
        picked = pick(template(name))
        ctx = ReplyContext(prompt_tail=raw.generation_prompt or "", tools=tuple(dict(t) for t in tools))
        return picked.fmt, ctx, picked.label

    def parser_config(self, raw: ReplayInput) -> dict[str, Any]:
        fmt, ctx, label = self._setup(raw, ())
        return {"template": template_for(raw.family, raw.model), "format": label,
                "starts_in_reasoning": fmt.starts_in_reasoning(ctx), "reasoning_format": "auto"}

    def units(self, raw: ReplayInput) -> list[int]:
        return list(range(len(raw.text)))  # characters: no tokenizer here (module docstring)

    def parse(self, raw: ReplayInput, tools: Sequence[ToolSpec]) -> ParseResult:
        fmt, ctx, _ = self._setup(raw, tools)
        r = fmt.parse(raw.text, ctx, final=True)
        return _result(r.content, r.reasoning, r.calls)

    def parse_stream(self, raw: ReplayInput, chunks: Sequence[Sequence[int]],
                     tools: Sequence[ToolSpec]) -> ParseResult:
        return self.parse_stream_text(raw, ["".join(raw.text[i] for i in c) for c in chunks], tools)

    def parse_stream_text(self, raw: ReplayInput, deltas: Sequence[str], tools: Sequence[ToolSpec]) -> ParseResult:
        fmt, ctx, _ = self._setup(raw, tools)
        stream, acc = ReplyStream(fmt, ctx), StreamAccumulator()
        for piece in [*deltas, None]:
            d = stream.feed(piece) if piece is not None else stream.finish()
            acc.add_content(d.content)
            acc.add_reasoning(d.reasoning)
            first = len(stream.calls) - len(d.calls)
            for i, c in enumerate(d.calls):
                acc.add_tool_call(first + i, name=c.name, arguments=c.arguments)
        return acc.result()

"""Tool calls written back into a prompt, for a template that does not render them itself (the calls in
Hermes', Llama 3's or Mistral's shape, the results in tags), and the grammar of a JSON reply
(`response_format`). Reading a reply's calls, and the grammar that holds a call in a family's own format,
are each family's (engine/conversation/formats/)."""

import json
from typing import Any

from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

from swarmtune.engine.errors import UserError

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
MISTRAL_TAG = "[TOOL_CALLS]"


def render_call(fam: str, name: str, arguments: str) -> str:
    """A call as the model writes it, for an assistant message sent back in a later prompt."""
    try:
        args = json.loads(arguments) if arguments else {}
    except json.JSONDecodeError:
        args = arguments
    if fam == "mistral":
        return MISTRAL_TAG + json.dumps([{"name": name, "arguments": args}], ensure_ascii=False)
    if fam == "llama":
        return json.dumps({"name": name, "parameters": args}, ensure_ascii=False)
    return f"{HERMES_OPEN}\n" + json.dumps({"name": name, "arguments": args}, ensure_ascii=False) + f"\n{HERMES_CLOSE}"


def render_result(content: str) -> str:
    return f"<tool_response>\n{content}\n</tool_response>"


def json_grammar(schema: dict[str, Any] | None) -> str:
    """GBNF for `response_format`: any JSON object (json_object), or one that validates (json_schema)."""
    if schema is None:
        return JSON_GBNF
    try:
        return str(json_schema_to_gbnf(json.dumps(schema)))
    except Exception as e:
        raise UserError(f"response_format's schema cannot be enforced: {e}", field="response_format") from None

"""Tool calls written back into a prompt and constrained in a reply: the calls and their results as the text of
the next prompt, for a template that does not render them itself; and a grammar that makes a call parse.

Reading a reply's calls back is each family's format's (engine/conversation/formats/). The grammars here write
a call in Hermes', Llama 3's or Mistral's shape: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
a bare `{"name": ..., "parameters": {...}}`, or `[TOOL_CALLS][{"name", "arguments"}]`."""

import json
import re
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


# grammars: a call that always parses
def _call_schema(tool: dict[str, Any], fam: str) -> dict[str, Any]:
    fn = tool["function"]
    params = fn.get("parameters") or {"type": "object"}
    key = "parameters" if fam == "llama" else "arguments"
    return {"type": "object", "properties": {"name": {"const": fn["name"]}, key: params},
            "required": ["name", key]}


def _rename_root(gbnf: str, to: str) -> str:
    return re.sub(r"^root ::=", f"{to} ::=", gbnf, count=1, flags=re.M)


def call_grammar(tools: list[dict[str, Any]], fam: str, parallel: bool) -> str:
    """GBNF for a reply that is nothing but calls of these tools, each with arguments that validate."""
    schemas = [_call_schema(t, fam) for t in tools]
    schema = schemas[0] if len(schemas) == 1 else {"oneOf": schemas}
    try:
        body = _rename_root(json_schema_to_gbnf(json.dumps(schema)), "call")
    except Exception as e:  # the converter raises plain exceptions for schemas it cannot express
        raise UserError(f"a tool's parameters schema cannot be enforced: {e}", field="tools") from None
    if fam == "mistral":
        root = f'root ::= "{MISTRAL_TAG}" "[" call ' + ('("," space call)* ' if parallel else "") + '"]"'
    elif fam == "llama":
        root = "root ::= call" + (' (";" space call)*' if parallel else "")
    else:
        one = f'"{HERMES_OPEN}\\n" call "\\n{HERMES_CLOSE}"'
        root = f"root ::= {one}" + (f' ("\\n" {one})*' if parallel else "")
    return body + "\n" + root + "\n"


# Where a call begins, for a lazy grammar under tool_choice auto (regexes searched in the reply so far; the
# grammar holds from the first group's start). A family missing here is read, not constrained.
TRIGGERS: dict[str, tuple[str, ...]] = {
    "qwen3-hermes": (re.escape(HERMES_OPEN),),
    "llama": (r"^\s*(\{\s*\")",),  # a bare JSON call is the whole reply
    "mistral": (re.escape(MISTRAL_TAG),),
}


def lazy_call_grammar(tools: list[dict[str, Any]], fam: str, parallel: bool) -> tuple[str, tuple[str, ...]] | None:
    """The call grammar and its triggers for tool_choice auto: the model writes what it likes until it begins a
    call, and the call is then held to the offered tools and their schemas, so a call it begins always parses.
    None for a family whose call grammar swarmtune does not write."""
    if fam not in TRIGGERS:
        return None
    return call_grammar(tools, fam, parallel), TRIGGERS[fam]


def json_grammar(schema: dict[str, Any] | None) -> str:
    """GBNF for `response_format`: any JSON object (json_object), or one that validates (json_schema)."""
    if schema is None:
        return JSON_GBNF
    try:
        return str(json_schema_to_gbnf(json.dumps(schema)))
    except Exception as e:
        raise UserError(f"response_format's schema cannot be enforced: {e}", field="response_format") from None

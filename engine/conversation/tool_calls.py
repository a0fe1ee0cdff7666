"""Tool calls: what a model writes when it calls a function, turned into OpenAI `tool_calls`; the calls
and their results turned back into the text of the next prompt; and a grammar that makes a call parse.

The formats the families people run emit:
- Hermes and Qwen (and any model whose template does not offer tools: engine/conversation/chat_template.py offers them
  in this format): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per call;
- Llama 3.x: a bare JSON object, `{"name": ..., "parameters": {...}}` (or "arguments"), `;`-separated;
- Mistral: `[TOOL_CALLS]` then a JSON array of `{"name", "arguments"}`.
A family whose format none of these matches keeps its text as content."""

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

from swarmtune.engine.errors import UserError

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
MISTRAL_TAG = "[TOOL_CALLS]"


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


def family(template_source: str) -> str:
    """Which format a model's template writes and reads: hermes, llama3, mistral."""
    if "[TOOL_CALLS]" in template_source:
        return "mistral"
    if "<|python_tag|>" in template_source or "<|eom_id|>" in template_source or (
            "<|start_header_id|>" in template_source and "tools" in template_source):
        return "llama3"
    return "hermes"  # Qwen, Hermes, and what engine/conversation/chat_template.py offers a template without tools


def _call(obj: Any, names: set[str] | None) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict) or (names is not None and obj["name"] not in names):
        return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False), new_call_id())


def parse(text: str, fam: str, names: set[str] | None = None) -> tuple[str, list[ToolCall]]:
    """(content, calls) of a reply. What does not parse as a call stays content."""
    if fam == "mistral" and MISTRAL_TAG in text:
        head, _, rest = text.partition(MISTRAL_TAG)
        try:
            items = json.loads(rest.strip())
        except json.JSONDecodeError:
            return text, []
        calls = [c for c in (_call(i, names) for i in (items if isinstance(items, list) else [items])) if c]
        return (head.strip(), calls) if calls else (text, [])
    if fam == "llama3":
        body = text.strip().removeprefix("<|python_tag|>")
        calls = []
        for part in body.split(";"):
            try:
                c = _call(json.loads(part), names)
            except json.JSONDecodeError:
                c = None
            if c is None:
                break
            calls.append(c)
        else:
            if calls:
                return "", calls
    # Hermes / Qwen (and the fallback for any family: small models imitate the offered format)
    calls, content, pos = [], [], 0
    for m in re.finditer(re.escape(HERMES_OPEN) + r"\s*(.*?)\s*" + re.escape(HERMES_CLOSE), text, re.S):
        try:
            c = _call(json.loads(m.group(1)), names)
        except json.JSONDecodeError:
            c = None
        if c is None:
            continue
        content.append(text[pos : m.start()])
        calls.append(c)
        pos = m.end()
    if not calls:
        return text, []
    tail = text[pos:]
    content.append(tail[: tail.find(HERMES_OPEN)] if HERMES_OPEN in tail else tail)  # a call cut by max_tokens
    return "".join(content).strip(), calls


def render_call(fam: str, name: str, arguments: str) -> str:
    """A call as the model writes it, for an assistant message sent back in a later prompt."""
    try:
        args = json.loads(arguments) if arguments else {}
    except json.JSONDecodeError:
        args = arguments
    if fam == "mistral":
        return MISTRAL_TAG + json.dumps([{"name": name, "arguments": args}], ensure_ascii=False)
    if fam == "llama3":
        return json.dumps({"name": name, "parameters": args}, ensure_ascii=False)
    return f"{HERMES_OPEN}\n" + json.dumps({"name": name, "arguments": args}, ensure_ascii=False) + f"\n{HERMES_CLOSE}"


def render_result(content: str) -> str:
    return f"<tool_response>\n{content}\n</tool_response>"


# grammars: a call that always parses
def _call_schema(tool: dict[str, Any], fam: str) -> dict[str, Any]:
    fn = tool["function"]
    params = fn.get("parameters") or {"type": "object"}
    key = "parameters" if fam == "llama3" else "arguments"
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
    elif fam == "llama3":
        root = "root ::= call" + (' (";" space call)*' if parallel else "")
    else:
        one = f'"{HERMES_OPEN}\\n" call "\\n{HERMES_CLOSE}"'
        root = f"root ::= {one}" + (f' ("\\n" {one})*' if parallel else "")
    return body + "\n" + root + "\n"


def json_grammar(schema: dict[str, Any] | None) -> str:
    """GBNF for `response_format`: any JSON object (json_object), or one that validates (json_schema)."""
    if schema is None:
        return JSON_GBNF
    try:
        return str(json_schema_to_gbnf(json.dumps(schema)))
    except Exception as e:
        raise UserError(f"response_format's schema cannot be enforced: {e}", field="response_format") from None


class CallStream:
    """A streamed reply that may hold calls: its content goes out as it comes, what may be a call is held,
    and the calls come out at its end (whole: each call's arguments in one delta)."""

    def __init__(self, fam: str, names: set[str] | None, active: bool) -> None:
        self.fam, self.names, self.active = fam, names, active
        self.text = ""
        self.sent = 0  # characters of text sent as content
        self.in_call = False

    def feed(self, piece: str) -> str:
        self.text += piece
        if not self.active:
            return piece
        if self.fam != "hermes" or self.in_call:
            return ""  # a bare-JSON or tagged-array family: the whole reply is read at its end
        i = self.text.find(HERMES_OPEN, self.sent)
        if i >= 0:
            self.in_call = True
            out, self.sent = self.text[self.sent : i], i
            return out
        keep = next((n for n in range(min(len(HERMES_OPEN) - 1, len(self.text)), 0, -1)
                     if self.text.endswith(HERMES_OPEN[:n])), 0)
        out = self.text[self.sent : len(self.text) - keep]
        self.sent += len(out)
        return out

    def finish(self) -> tuple[str, list[ToolCall]]:
        """(content not sent yet, the calls)."""
        if not self.active:
            return "", []
        content, calls = parse(self.text[self.sent :], self.fam, self.names)
        return content, calls

"""GBNF for a call in a family's own format: the pieces every family's grammar is built from.

A call's arguments are held to its tool's JSON schema by llama.cpp's schema converter (llama-cpp-python's
port of json-schema-to-grammar). One grammar holds several tools' schemas, and a text-valued format one
schema a parameter, so each converted schema's rules are renamed under a prefix of their own."""

import json
import re
from collections.abc import Sequence
from typing import Any

from llama_cpp.llama_grammar import json_schema_to_gbnf

from swarmtune.engine.errors import UserError

_RULE = re.compile(r"^([A-Za-z0-9-]+) ::=", re.M)
# in a rule's body: a string literal, a character class, or a name (only names are renamed)
_PIECE = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|[A-Za-z][A-Za-z0-9-]*')


def literal(text: str) -> str:
    """A GBNF string literal matching exactly `text`."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return f'"{escaped.replace(chr(9), chr(92) + "t")}"'


def schema_rules(schema: dict[str, Any] | None, prefix: str) -> tuple[str, str]:
    """(rules, root name): values that validate against `schema` (any JSON value without one), every rule named
    under `prefix`. A schema the converter cannot express is the client's error, said in one line."""
    try:
        gbnf = str(json_schema_to_gbnf(json.dumps(schema if schema else {})))
    except Exception as e:  # the converter raises plain exceptions for schemas it cannot express
        raise UserError(f"a tool's parameters schema cannot be enforced: {e}", field="tools") from None
    # a JSON string holds no raw control character (json.loads refuses one; llama.cpp's converter says so
    # too, its Python port lets them through)
    gbnf = gbnf.replace('char ::= [^"\\\\]', 'char ::= [^"\\\\\\x7F\\x00-\\x1F]')
    names = set(_RULE.findall(gbnf))

    def rename(m: re.Match[str]) -> str:
        piece = m.group(0)
        return f"{prefix}-{piece}" if piece in names else piece

    rules = "\n".join(_PIECE.sub(rename, line) for line in gbnf.strip().splitlines())
    return rules, f"{prefix}-root"


def rule_name(text: str) -> str:
    """A rule name made from a tool's or a parameter's name (GBNF names are letters, digits and dashes)."""
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "x"


def tool_parts(tools: Sequence[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(name, parameters schema) of each offered tool, in OpenAI's shape or bare."""
    out = []
    for t in tools:
        fn = t.get("function", t)
        params = fn.get("parameters")
        out.append((str(fn["name"]), params if isinstance(params, dict) else {"type": "object"}))
    return out


def json_call_object(tools: Sequence[dict[str, Any]], args_key: str, prefix: str = "call") -> tuple[str, str]:
    """(rules, root name): one JSON object `{"name": NAME, args_key: {...}}` naming one of the tools, its
    arguments validating against that tool's schema."""
    rules, alternatives = [], []
    for i, (name, params) in enumerate(tool_parts(tools)):
        schema = {"type": "object", "properties": {"name": {"const": name}, args_key: params},
                  "required": ["name", args_key]}
        body, root = schema_rules(schema, f"{prefix}{i}")
        rules.append(body)
        alternatives.append(root)
    return "\n".join(rules) + f"\n{prefix} ::= " + " | ".join(alternatives), prefix


def repeated(one: str, parallel: bool, between: str = '"\\n"') -> str:
    """A root of one call, or (parallel) one or more separated by `between`."""
    return f"root ::= {one}" + (f" ({between} {one})*" if parallel else "")

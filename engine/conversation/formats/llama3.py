"""Llama 3.1-3.3 and Llama 4: a reply that is nothing but its calls. Llama 3 writes each call as a bare JSON
object, `{"name": "get_weather", "parameters": {"city": "Paris"}}` ("arguments" also seen), several joined
by `;`, optionally after `<|python_tag|>` (which may follow some text); Llama 4 writes a Python list of
calls, `[get_weather(city="Paris"), get_time()]`, optionally inside `<|python_start|>…<|python_end|>`.

From Meta's chat templates (the tool instructions of meta-llama/Llama-3.x-Instruct's) and its prompt-format
docs for Llama 3.1 and 4, read as vLLM's llama3_json / llama4_pythonic parsers read them. Without a marker a
reply is calls only where the whole of it is: `{"a": 1} is a dict` and a JSON answer without "name" stay
content. So a reply that opens like a call is held back until it is one, or is not one, or ends.

Also the JSON scanner the Mistral and Kimi formats share: where a JSON value ends in a text, or that the
text ends before it does."""

import ast
import json
import re
from typing import Any

from swarmtune.engine.conversation.formats.base import Format, dumps
from swarmtune.engine.conversation.formats.grammar import json_call_object, repeated
from swarmtune.engine.conversation.formats.reply import Reply, ReplyContext, ToolCall, new_call_id

PYTHON_TAG = "<|python_tag|>"
PY_START, PY_END = "<|python_start|>", "<|python_end|>"
_ENDS = ("<|eom_id|>", "<|eot_id|>", "<|eom|>", "<|eot|>", PY_END)  # a stop token left in the text ends it

CUT, BAD = -1, -2  # scan_json: the text ends before the value does; the text is no JSON value

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_STRING_CUT = re.compile(r'"(?:[^"\\]|\\.)*\\?\Z', re.S)
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_NUMBER_CUT = re.compile(r"-?(?:(?:0|[1-9]\d*)(?:\.\d*)?(?:[eE][+-]?\d*)?)?\Z")
_LITERALS = ("true", "false", "null")
_CLOSER = {"{": "}", "[": "]"}


def scan_json(text: str, at: int) -> int:
    """Where the JSON value that starts at `at` (after blanks) ends: the index past it, CUT where the text
    ends first (it may yet be one), or BAD where it cannot be one whatever follows. Strings are skipped by a
    regex, so a brace or a marker inside one ends nothing."""
    stack: list[str] = []
    expect = "value"  # value | key | first key | first value | after value | after key
    i = at
    n = len(text)
    while True:
        i = skip_ws(text, i)
        if i >= n:
            return CUT
        c = text[i]
        if expect in ("key", "first key"):
            if c == "}" and expect == "first key":
                stack.pop()
                i += 1
                expect = "after value"
            elif c == '"':
                i = _string(text, i)
                if i < 0:
                    return i
                expect = "after key"
            else:
                return BAD
        elif expect == "after key":
            if c != ":":
                return BAD
            i += 1
            expect = "value"
        elif expect == "first value" and c == "]":
            stack.pop()
            i += 1
            expect = "after value"
        elif expect in ("value", "first value"):
            if c in _CLOSER:
                stack.append(c)
                i += 1
                expect = "first key" if c == "{" else "first value"
                continue
            i = _scalar(text, i)
            if i < 0:
                return i
            expect = "after value"
        else:  # after value
            if not stack:
                return i
            if c == ",":
                i += 1
                expect = "key" if stack[-1] == "{" else "value"
            elif c == _CLOSER[stack[-1]]:
                stack.pop()
                i += 1
            else:
                return BAD
        if expect == "after value" and not stack:
            return i


def skip_ws(text: str, i: int) -> int:
    """Past JSON's blanks from `i`."""
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _string(text: str, i: int) -> int:
    m = _STRING.match(text, i)
    if m:
        return m.end()
    return CUT if _STRING_CUT.match(text, i) else BAD


def _scalar(text: str, i: int) -> int:
    c = text[i]
    if c == '"':
        return _string(text, i)
    if c == "-" or "0" <= c <= "9":
        if _NUMBER_CUT.match(text, i):  # a number at the text's end may go on
            return CUT
        m = _NUMBER.match(text, i)
        return m.end() if m else BAD
    for lit in _LITERALS:
        if text.startswith(lit, i):
            return i + len(lit)
        if len(text) - i < len(lit) and lit.startswith(text[i:]):
            return CUT
    return BAD


def load_json(text: str) -> Any:
    """The value scan_json found (control characters in strings allowed, as models write them); None where
    it is no JSON after all (a bad escape)."""
    try:
        return json.loads(text, strict=False)
    except (ValueError, RecursionError):  # JSONDecodeError, or an integer past the digit limit
        return None


class Llama3(Format):
    name = "llama"
    markers = (PYTHON_TAG, PY_START) + _ENDS
    call_start = '{"name"'  # how Meta's templates write a call; after <|python_tag|> too
    think_open = ""
    think_close = ""

    def triggers(self) -> tuple[str, ...]:
        """A call is the whole reply, as Meta's templates ask (a JSON answer whose first key happens to be
        "name" later in a reply is not held), or follows <|python_tag|>: the grammar starts at its brace."""
        return (r'^\s*(\{\s*"name")', r"<\|python_tag\|>\s*(\{)")

    def call_grammar(self, tools: list[dict[str, Any]], parallel: bool) -> str:
        """Meta's JSON call, `{"name": ..., "parameters": {...}}`, `;`-separated where parallel."""
        rules, call = json_call_object(tools, "parameters")
        return f"{rules}\n" + repeated(call, parallel, '";" " "?') + "\n"

    @classmethod
    def for_template(cls, source: str) -> "Llama3 | None":
        # Meta's templates: header tokens, and the JSON call shape spelled out in the tool instructions.
        # Functionary and Firefunction also use Llama 3's headers but call in their own ways.
        headers = "<|start_header_id|>" in source or "<|header_start|>" in source
        meta_calls = '"parameters"' in source or PYTHON_TAG in source or PY_START in source
        others = ("<function=", ">>>", "functools[", "<tool_call>")
        if headers and meta_calls and not any(o in source for o in others):
            return cls()
        return None

    def parse(self, text: str, ctx: ReplyContext, final: bool = True) -> Reply:
        head = len(text) - len(text.lstrip())
        tag, kind = _first_marker(text)
        if tag < 0 or text[head:].startswith(("{", "[")):
            # no marker before the reply's own start: the whole reply is calls or it is content
            tag, kind, start = head, "bare", head
        else:
            start = tag + len(PYTHON_TAG if kind == "tag" else PY_START)
        before = text[:tag]
        outcome, calls = _calls(text[start:], kind, final)
        if outcome == "calls":
            return Reply(before if before.strip() else "", "", tuple(calls))
        if outcome == "wait":
            return Reply(before if before.strip() else "")
        if outcome == "cut":
            broken = "the reply ended inside a call (max_tokens?)"
            if kind != "bare":  # after a marker it was a call: cut short, it is no content
                return Reply(before if before.strip() else "", "", (), broken)
            # bare, it may as well have been a JSON answer cut short: the text stays, as written
            return Reply(text if text.strip() else "", "", (), broken)
        broken = f"{text[tag:tag + 80]!r} is not a call" if kind != "bare" else ""
        return Reply(text if text.strip() else "", "", (), broken)


def _first_marker(text: str) -> tuple[int, str]:
    """The first <|python_tag|> or <|python_start|>, where the reply's own start is not a call."""
    tag, start = text.find(PYTHON_TAG), text.find(PY_START)
    if start >= 0 and (tag < 0 or start < tag):
        return start, "python"
    return tag, "tag"


def _calls(region: str, kind: str, final: bool) -> tuple[str, list[ToolCall]]:
    """What the text after the reply's start (or its marker) is: "calls" (and which), "wait" (it may still
    become calls), "cut" (the reply ended while it could still have become calls) or "content"."""
    body = region.strip()
    for end in _ENDS:
        if body.endswith(end):
            body = body[: -len(end)].rstrip()
    if kind == "python" or body.startswith("["):
        return _pythonic(body, final)
    if kind == "bare":
        return _json_calls(body, final) if body.startswith("{") else ("content", [])
    if _BUILTIN.match(body):  # Llama 3.1's built-in tools: `brave_search.call(query="...")`
        return _pythonic(f"[{body}]", final)
    if body and _BUILTIN_CUT.match(body):
        return ("cut" if final else "wait"), []
    return _json_calls(body, final)


def _json_calls(body: str, final: bool) -> tuple[str, list[ToolCall]]:
    calls: list[ToolCall] = []
    i = 0
    while True:
        if i >= len(body):
            return ("calls", calls) if calls and final else ("cut" if final else "wait", [])
        if body[i] != "{":
            return "content", []
        end = scan_json(body, i)
        if end == CUT:
            return ("cut" if final else "wait"), []
        if end == BAD:
            return "content", []
        call = _json_call(load_json(body[i:end]))
        if call is None:
            return "content", []
        calls.append(call)
        i = skip_ws(body, end)
        if i < len(body) and body[i] == ";":
            i = skip_ws(body, i + 1)
            if i >= len(body) and final:
                return "calls", calls  # a trailing separator


def _json_call(obj: Any) -> ToolCall | None:
    """A call only where it names a function and carries its arguments: a JSON answer with a "name" key
    is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    key = "parameters" if "parameters" in obj else "arguments" if "arguments" in obj else None
    if key is None:
        return None
    args = obj[key]
    if isinstance(args, str):  # double-encoded, as some fine-tunes write it
        args = load_json(args) if args.strip() else {}
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], dumps(args), new_call_id())


_BUILTIN = re.compile(r"[A-Za-z_]\w*\.call\(")
_BUILTIN_CUT = re.compile(r"[A-Za-z_]\w*(?:\.(?:c(?:a(?:l(?:l)?)?)?)?)?\Z")
_PY_HEAD = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")
_PY_HEAD_CUT = re.compile(r"(?:\[\s*(?:[A-Za-z_][\w.]*\s*)?)?\Z")


def _pythonic(body: str, final: bool) -> tuple[str, list[ToolCall]]:
    if not _PY_HEAD.match(body):
        if _PY_HEAD_CUT.match(body):
            return ("cut" if final else "wait"), []
        return "content", []
    if not final:
        return "wait", []  # a Python list is read whole, at the end
    try:
        calls = _python_calls(body)
    except SyntaxError as e:  # where Python found the text to end too soon, the list was cut short
        return ("cut" if any(w in str(e.msg) for w in ("never closed", "EOF", "unterminated")) else "content"), []
    return ("calls", calls) if calls is not None else ("content", [])


def _python_calls(source: str) -> list[ToolCall] | None:
    """The calls of a Python list of them; None where it is some other Python. SyntaxError where it is none."""
    try:
        tree = ast.parse(source, mode="eval")
    except (ValueError, RecursionError):
        return None
    if not isinstance(tree.body, ast.List) or not tree.body.elts:
        return None
    calls: list[ToolCall] = []
    for node in tree.body.elts:
        if not isinstance(node, ast.Call) or node.args:
            return None
        name = _dotted(node.func)
        args: dict[str, Any] = {}
        for kw in node.keywords:
            if kw.arg is None:
                return None
            try:
                args[kw.arg] = _jsonable(ast.literal_eval(kw.value))
            except (ValueError, TypeError, SyntaxError, RecursionError):
                return None
        if not name:
            return None
        calls.append(ToolCall(name, dumps(args), new_call_id()))
    return calls


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute) and node.attr == "call" and isinstance(node.value, ast.Name):
        return node.value.id  # a built-in tool's `name.call(...)`
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else ""
    return ""


def _jsonable(value: Any) -> Any:
    """A Python literal as JSON has it: tuples are lists; what JSON has no word for is no argument."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, (str, int, float, bool)) for k in value):
        return {str(k) if not isinstance(k, str) else k: _jsonable(v) for k, v in value.items()}
    raise ValueError(f"not a JSON value: {value!r}")

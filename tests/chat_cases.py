"""The tools and the plain reply llama.cpp's tests/test-chat.cpp uses across its templates' cases, shared by
the tests that port them (tests/test_format_*.py)."""

from typing import Any

ASSIST = "Hello, world!\nWhat's up?"  # a reply with no call


def tool(tool_name: str, /, **props: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": tool_name, "parameters": {"type": "object", "properties": props}}}


STRING, INTEGER = {"type": "string"}, {"type": "integer"}
SPECIAL = tool("special_function", arg1=INTEGER)
SPECIAL_OPT = tool("special_function_with_opt", arg1=INTEGER, arg2=INTEGER)

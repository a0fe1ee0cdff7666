"""The OpenAI request bodies swarmtune serves, checked field by field, and OpenAI's error shape.

Unknown fields are ignored (clients send many, as llama-server ignores them); a known field of the wrong
type, an unknown role, an empty conversation or a value out of range is a 400 in one line that names the
field, and changes nothing."""

import json
import re
from typing import Annotated, Any, Literal, TypeVar

import numpy as np
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

MAX_DEPTH = 32  # nesting of a body's arrays and objects: the deepest API shape is a handful
MAX_STOP = 4
M = TypeVar("M", bound=BaseModel)


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None) -> None:
        super().__init__(message)
        self.param, self.status, self.code = param, status, code


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(e: BadRequest) -> JSONResponse:
    kind = "invalid_request_error" if e.status < 500 else "server_error"
    return JSONResponse(error_body(str(e), kind, e.param, e.code), status_code=e.status)


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    name: str
    arguments: str = ""


class MessageToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    reasoning_content: str | None = None  # an earlier reply's reasoning, sent back (llama-server's field)
    reasoning: str | None = None  # vLLM's name for it

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: bool = False


Probability = Annotated[float, Field(ge=0.0, le=1.0)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]


class SamplingFields(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    model: str | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Probability | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None  # an extension, as llama-server takes it
    min_p: Probability | None = None  # an extension
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    n: Annotated[int, Field(ge=1)] | None = None
    user: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool | int | None = None
    ignore_eos: bool = False  # an extension (llama-server's, vLLM's): generate max_tokens, past any end

    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        if len(stops) > MAX_STOP:
            raise BadRequest(f"stop takes at most {MAX_STOP} sequences (got {len(stops)})", "stop")
        return tuple(s for s in stops if s)

    def check_supported(self) -> None:
        if self.n is not None and self.n != 1:
            raise BadRequest(f"n must be 1 (got {self.n}): swarmtune generates one choice per request", "n")
        if self.logprobs:
            raise BadRequest("logprobs are not supported by swarmtune serve", "logprobs")


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    name: str = "response"
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]


class ChatRequest(SamplingFields):
    messages: list[Message]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    top_logprobs: int | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    # the template's variables (llama-server's and vLLM's extension): {"enable_thinking": false}, ...
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: Effort | None = None

    def limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class TemplateRequest(BaseModel):
    """POST /apply-template's body: a chat's messages, tools and template variables (the rest is ignored)."""

    model_config = ConfigDict(extra="ignore", strict=True)
    messages: list[Message]
    tools: list[Tool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: Effort | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int]
    echo: bool = False

    def limit(self) -> int | None:
        return self.max_tokens


def parse_json(raw: bytes) -> dict[str, Any]:
    """A body as a JSON object, or one line saying why not (its size is the server's front door's: guard.py)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRequest(f"the body is not valid UTF-8 (byte {e.start})") from None
    depth = _depth(text)
    if depth > MAX_DEPTH:
        raise BadRequest(f"the body nests {depth} arrays and objects deep; at most {MAX_DEPTH} are accepted")
    try:
        body = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise BadRequest(f"the body is not JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except ValueError as e:  # an integer past Python's digit limit, or NaN/Infinity (not JSON)
        raise BadRequest(f"the body is not JSON a server can read: {str(e).splitlines()[0][:120]}") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    if (bad := _unreadable(body)) is not None:
        raise BadRequest(f"the body holds {bad}")
    return body


def _depth(text: str) -> int:
    """How deep a JSON text's brackets nest (those in strings not counted), read before parsing it: Python's
    parser recurses, and a body a million brackets deep would end it with a RecursionError."""
    brackets = _STRING.sub("", text).encode("utf-8", "surrogatepass")
    b = np.frombuffer(brackets, dtype=np.uint8)
    steps = ((b == 91) | (b == 123)).astype(np.int32) - ((b == 93) | (b == 125)).astype(np.int32)  # [{ and ]}
    return int(np.cumsum(steps).max(initial=0))


_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
MAX_NUMBER = 2**53  # past it a JSON number is not exact in most clients' parsers, and no field takes one


def _unreadable(v: Any) -> str | None:
    """What in a parsed body no field can take, in words, if anything: a number past 2^53 (or 1e400, read as
    infinity), or a string with a lone UTF-16 surrogate (JSON's "\\ud800" escapes one; UTF-8 cannot hold it)."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int | float):
        if abs(v) <= MAX_NUMBER:
            return None
        shown = str(v)[:24] + "..." if isinstance(v, int) else str(v)
        return f"the number {shown}, past {MAX_NUMBER} (2^53), which no field takes"
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError as e:
            return f"a string with a lone surrogate (\\u{ord(v[e.start]):04x}), which is no character"
        return None
    if isinstance(v, dict):
        return next((bad for k, x in v.items() if (bad := _unreadable(k) or _unreadable(x)) is not None), None)
    return next((bad for x in v if (bad := _unreadable(x)) is not None), None)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def validated(model: type[M], body: dict[str, Any]) -> M:
    try:
        return model.model_validate(body)
    except ValidationError as e:
        err = max(e.errors(), key=lambda x: len(x["loc"]))  # of a union's members, the one it got furthest in
        loc = ".".join(str(x) for x in err["loc"] if not (isinstance(x, str) and x in _UNION_TAGS))
        got = err.get("input")
        shown = "" if err["type"] == "missing" else f" (got {json.dumps(got)[:60]})"
        raise BadRequest(f"{loc}: {err['msg']}{shown}", loc) from None


# the names pydantic puts in an error's location for a union's member; a client knows only its fields
_UNION_TAGS = {"str", "list[TextPart]", "list[str]", "list[int]", "int", "float", "bool", "function-after",
               "constrained-int", "constrained-float", "StreamOptions", "TextPart", "NamedToolChoice",
               "literal['auto','none','required']", "list[MessageToolCall]", "ResponseFormat", "dict[str,any]"}

"""The OpenAI request bodies swarmtune serves, checked field by field, and OpenAI's error shape.

Unknown fields are ignored (clients send many, as llama-server ignores them); a known field of the wrong
type, an unknown role, an empty conversation or a value out of range is a 400 in one line that names the
field, and changes nothing."""

import json
from typing import Annotated, Any, Literal, TypeVar

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

MAX_BODY_BYTES = 16 * 1024 * 1024  # a prompt this large is far past any agent's context anyway
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


class ChatRequest(SamplingFields):
    messages: list[Message]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    top_logprobs: int | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None

    def limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int]
    echo: bool = False

    def limit(self) -> int | None:
        return self.max_tokens


def parse_json(raw: bytes) -> dict[str, Any]:
    if len(raw) > MAX_BODY_BYTES:
        raise BadRequest(f"the body is {len(raw)} bytes; at most {MAX_BODY_BYTES} are accepted")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRequest(f"the body is not valid UTF-8 (byte {e.start})") from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadRequest(f"the body is not JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


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

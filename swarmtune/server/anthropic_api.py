"""Anthropic's Messages API over the served agents (what Claude Code and the `anthropic` SDK speak, with
ANTHROPIC_BASE_URL pointed here): POST /v1/messages, streamed or not, and /v1/messages/count_tokens.

A `system` string or text blocks; messages of `text`, `tool_use` and `tool_result` blocks; `tools` with
an `input_schema`; `tool_choice` auto, any, tool (a grammar makes the call parse) or none;
`stop_sequences`, `temperature`, `top_p`, `top_k`. Errors in Anthropic's shape,
`{"type": "error", "error": {"type", "message"}}`."""

import hashlib
import json
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from swarmtune.engine.agents.served_request import Busy, Closed, Delta, Finished
from swarmtune.engine.conversation.chat_message import ChatMessage
from swarmtune.engine.conversation.formats.reply import Reply, ToolCall
from swarmtune.server.bridge import AGENT_HEADER, Bridge, Sampling, ToolPlan, account, plan_tools, template_variables
from swarmtune.server.openai_schema import MAX_STOP, BadRequest, parse_json, validated


class TextBlock(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["text"]
    text: str


class ToolUseBlock(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] = ""
    is_error: bool = False

    def text(self) -> str:
        body = self.content if isinstance(self.content, str) else "".join(b.text for b in self.content)
        return f"error: {body}" if self.is_error else body


class ThinkingBlock(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["thinking"]
    thinking: str
    signature: str = ""


class RedactedThinkingBlock(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["redacted_thinking"]
    data: str = ""


Block = Annotated[TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
                  Field(discriminator="type")]


class Thinking(BaseModel):
    """Anthropic's `thinking` switch: enabled (with a budget), adaptive (the model decides), disabled."""

    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: Annotated[int, Field(ge=1)] | None = None

    def enabled(self) -> bool | None:
        """The template's enable_thinking: None under adaptive, where the template's default decides."""
        return {"enabled": True, "disabled": False}.get(self.type)


class AMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["user", "assistant"]
    content: str | list[Block]


class ATool(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_\-]{1,64}$")]
    description: str | None = None
    input_schema: dict[str, Any]


class AToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class Metadata(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    user_id: str | None = None


class MessagesRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    model: str | None = None
    max_tokens: Annotated[int, Field(ge=1)]
    messages: list[AMessage]
    system: str | list[TextBlock] | None = None
    stop_sequences: list[str] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    stream: bool = False
    tools: list[ATool] | None = None
    tool_choice: AToolChoice | None = None
    metadata: Metadata | None = None
    thinking: Thinking | None = None


class CountRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    model: str | None = None
    messages: list[AMessage]
    system: str | list[TextBlock] | None = None
    tools: list[ATool] | None = None


def error(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse({"type": "error", "error": {"type": kind, "message": message}}, status_code=status)


def _tools(tools: list[ATool] | None) -> list[dict[str, Any]]:
    """Anthropic's tools in OpenAI's shape, which the templates and the grammar take."""
    return [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                              "parameters": t.input_schema}} for t in tools or []]


def _messages(system: str | list[TextBlock] | None, messages: list[AMessage]) -> list[ChatMessage]:
    """Anthropic's conversation as engine/agents/prompt.py takes it: tool_use blocks are the assistant's calls,
    tool_result blocks become tool messages."""
    out: list[ChatMessage] = []
    if system:
        out.append({"role": "system", "content": system if isinstance(system, str) else "".join(
            b.text for b in system)})
    for m in messages:
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
            continue
        text = "".join(b.text for b in m.content if isinstance(b, TextBlock))
        thought = "".join(b.thinking for b in m.content if isinstance(b, ThinkingBlock))
        calls = [ToolCall(b.name, json.dumps(b.input, ensure_ascii=False), b.id) for b in m.content
                 if isinstance(b, ToolUseBlock)]
        for b in m.content:
            if isinstance(b, ToolResultBlock):
                out.append({"role": "tool", "content": b.text(), "tool_call_id": b.tool_use_id})
        if text or calls or m.role == "assistant":
            msg: ChatMessage = {"role": m.role, "content": text}
            if calls:
                msg["tool_calls"] = calls
            if thought and m.role == "assistant":
                msg["reasoning"] = thought
            out.append(msg)
    if not out or out[-1]["role"] == "assistant" and not out[-1].get("content"):
        raise BadRequest("messages: the conversation must end with a user message", "messages")
    return out


def _stop_reason(fin: Finished, calls: bool) -> tuple[str, str | None]:
    if calls:
        return "tool_use", None
    if fin.reason == "length":
        return "max_tokens", None
    if fin.stop_sequence is not None:
        return "stop_sequence", fin.stop_sequence
    return "end_turn", None


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def signature(thinking: str) -> str:
    """A thinking block's signature: Anthropic's is opaque, and clients keep it and send it back with the
    block. This one is a digest of the block's text; swarmtune does not check it on the way back (the
    template sees the text as sent)."""
    return "swarmtune:" + hashlib.sha256(thinking.encode()).hexdigest()[:32]


class Blocks:
    """A streamed reply's content blocks: thinking, then text, then the calls, each opened on its first
    delta and closed when the next kind begins."""

    def __init__(self) -> None:
        self.index, self.open, self.thought = 0, "", ""

    def _start(self, kind: str) -> bytes:
        out = self.close()
        self.open, self.thought = kind, ""  # a block's signature is its own text's
        block = {"type": "thinking", "thinking": ""} if kind == "thinking" else {"type": "text", "text": ""}
        return out + _sse("content_block_start", {"type": "content_block_start", "index": self.index,
                                                  "content_block": block})

    def close(self) -> bytes:
        if not self.open:
            return b""
        out = b""
        if self.open == "thinking":
            out = _sse("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                               "delta": {"type": "signature_delta",
                                                         "signature": signature(self.thought)}})
        self.open, self.index = "", self.index + 1
        return out + _sse("content_block_stop", {"type": "content_block_stop", "index": self.index - 1})

    def delta(self, d: Reply) -> bytes:
        out = b""
        if d.reasoning:
            if self.open != "thinking":
                out += self._start("thinking")
            self.thought += d.reasoning
            out += _sse("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                                "delta": {"type": "thinking_delta", "thinking": d.reasoning}})
        if d.content:
            if self.open != "text":
                out += self._start("text")
            out += _sse("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                                "delta": {"type": "text_delta", "text": d.content}})
        for c in d.calls:
            out += self.close()
            out += _sse("content_block_start", {"type": "content_block_start", "index": self.index,
                                                "content_block": {"type": "tool_use", "input": {},
                                                                  "id": "toolu_" + c.id.removeprefix("call_"),
                                                                  "name": c.name}})
            out += _sse("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": {
                "type": "input_json_delta", "partial_json": c.arguments}})
            out += _sse("content_block_stop", {"type": "content_block_stop", "index": self.index})
            self.index += 1
        return out


def _usage(fin: Finished) -> dict[str, Any]:
    u = fin.usage
    # Anthropic counts the input read from its cache apart from the rest
    return {"input_tokens": u.prompt_tokens - u.cached_tokens, "output_tokens": u.completion_tokens,
            "cache_read_input_tokens": u.cached_tokens, "cache_creation_input_tokens": 0}


def add_anthropic_routes(app: FastAPI, bridge: Bridge) -> None:
    def plan(body: MessagesRequest | CountRequest) -> ToolPlan:
        tc = body.tool_choice if isinstance(body, MessagesRequest) else None
        choice = {"auto": "auto", "any": "required", "none": "none"}.get(tc.type, tc.name or "") if tc else "auto"
        if tc is not None and tc.type == "tool" and not tc.name:
            raise BadRequest("tool_choice of type tool needs a name", "tool_choice")
        return plan_tools(_tools(body.tools), choice, bridge.fmt,
                          parallel=not (tc and tc.disable_parallel_tool_use))

    @app.post("/v1/messages/count_tokens", summary="Anthropic: the prompt's tokens, as this model counts them")
    async def count_tokens(request: Request) -> Response:
        try:
            body = validated(CountRequest, parse_json(await request.body()))
            prompt = await bridge.prompt(_messages(body.system, body.messages), plan(body).offered)
        except BadRequest as e:
            return error(e.status, "invalid_request_error", str(e))
        return JSONResponse({"input_tokens": len(prompt)})

    @app.post("/v1/messages", summary="Anthropic Messages: each conversation is an agent", response_class=Response)
    async def messages(request: Request) -> Response:
        try:
            body = validated(MessagesRequest, parse_json(await request.body()))
            if not body.messages:
                raise BadRequest("messages: at least one message is required", "messages")
            stops = tuple(s for s in body.stop_sequences or [] if s)
            if len(stops) > MAX_STOP * 2:
                raise BadRequest(f"stop_sequences takes at most {MAX_STOP * 2} sequences", "stop_sequences")
            p = plan(body)
            variables = template_variables(None, thinking=body.thinking.enabled() if body.thinking else None)
            prompt = await bridge.prompt(_messages(body.system, body.messages), p.offered, limit=body.max_tokens,
                                         variables=variables)
            reader = bridge.reader(p, prompt)
            key = request.headers.get(AGENT_HEADER) or (body.metadata.user_id if body.metadata else None)
            req = bridge.request(prompt, body.max_tokens, Sampling(body.temperature, body.top_p, body.top_k),
                                 stops, key, "messages", *bridge.held(p, reader), reader=reader)
            q = bridge.submit(req)
        except BadRequest as e:
            return error(e.status, "invalid_request_error" if e.status < 500 else "api_error", str(e))
        except Busy as e:
            return JSONResponse({"type": "error", "error": {"type": "overloaded_error", "message": str(e)}},
                                status_code=529, headers={"Retry-After": str(e.retry_after_s)})
        mid = f"msg_{req.id}"
        head = {"id": mid, "type": "message", "role": "assistant", "model": bridge.model}
        if not body.stream:
            got = await bridge.collect(request, req, q)
            if got is None:
                return Response(status_code=499)
            if isinstance(got, Closed):
                return error(503, "api_error", got.message)
            text, fin = got
            reply = reader.whole(text)
            calls = reply.calls
            content: list[dict[str, Any]] = [{"type": "thinking", "thinking": reply.reasoning,
                                              "signature": signature(reply.reasoning)}] if reply.reasoning else []
            content += [{"type": "text", "text": reply.content}] if reply.content else []
            content += [{"type": "tool_use", "id": "toolu_" + c.id.removeprefix("call_"), "name": c.name,
                         "input": json.loads(c.arguments)} for c in calls]
            reason, seq = _stop_reason(fin, bool(calls))
            return JSONResponse({**head, "content": content, "stop_reason": reason, "stop_sequence": seq,
                                 "usage": _usage(fin), "swarmtune": account(req)})

        async def stream() -> AsyncIterator[bytes]:
            yield _sse("message_start", {"type": "message_start", "message": {
                **head, "content": [], "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": req.prompt_tokens, "output_tokens": 0}}})
            yield _sse("ping", {"type": "ping"})
            reply, blocks = reader.stream(), Blocks()
            last_ping = time.monotonic()
            async for ev in bridge.events(req, q):
                if isinstance(ev, Delta):
                    if out := blocks.delta(reply.feed(ev.text)):
                        yield out
                    elif time.monotonic() - last_ping > 10:  # a long call being written: the line stays alive
                        last_ping = time.monotonic()
                        yield _sse("ping", {"type": "ping"})
                elif isinstance(ev, Closed):
                    yield _sse("error", {"type": "error", "error": {"type": "api_error", "message": ev.message}})
                else:
                    yield blocks.delta(reply.finish()) + blocks.close()
                    reason, seq = _stop_reason(ev, bool(reply.calls))
                    yield _sse("message_delta", {"type": "message_delta",
                                                 "delta": {"stop_reason": reason, "stop_sequence": seq},
                                                 "usage": _usage(ev), "swarmtune": account(req)})
                    yield _sse("message_stop", {"type": "message_stop"})

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

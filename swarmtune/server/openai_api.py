"""OpenAI's API over the served agents: POST /v1/chat/completions (tools, tool_choice, response_format)
and /v1/completions, streamed as Server-Sent Events or not; GET /v1/models."""

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from swarmtune.engine.agents.served_request import Busy, Closed, Delta, Finished, ServedRequest, Usage
from swarmtune.engine.conversation.chat_message import ChatMessage
from swarmtune.engine.conversation.formats.reply import Reply, ToolCall, new_call_id
from swarmtune.server.bridge import AGENT_HEADER, Bridge, Sampling, account, plan_tools, template_variables
from swarmtune.server.openai_schema import (
    BadRequest,
    ChatRequest,
    CompletionRequest,
    Message,
    NamedToolChoice,
    SamplingFields,
    TemplateRequest,
    error_body,
    error_response,
    parse_json,
    validated,
)

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def usage_body(u: Usage) -> dict[str, Any]:
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}


def normalised(m: Message) -> ChatMessage:
    """An OpenAI message as engine/agents/prompt.py takes it."""
    out: ChatMessage = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
    if m.tool_calls:
        out["tool_calls"] = [ToolCall(c.function.name, c.function.arguments, c.id or new_call_id())
                             for c in m.tool_calls]
    if m.tool_call_id:
        out["tool_call_id"] = m.tool_call_id
    if m.role == "assistant" and (reasoning := m.reasoning_content or m.reasoning):
        out["reasoning"] = reasoning
    return out


def sampling_of(body: SamplingFields) -> Sampling:
    body.check_supported()
    return Sampling(body.temperature, body.top_p, body.top_k, body.min_p, body.seed, body.presence_penalty,
                    body.frequency_penalty, body.ignore_eos)


def sse(obj: dict[str, Any] | str) -> bytes:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, separators=(',', ':'))}\n\n".encode()


def busy_response(e: Busy) -> JSONResponse:
    return JSONResponse(error_body(str(e), "server_error", None, "overloaded"), status_code=503,
                        headers={"Retry-After": str(e.retry_after_s)})


def closed_response(c: Closed) -> JSONResponse:
    return JSONResponse(error_body(c.message, "server_error", None, "shutting_down"), status_code=503)


async def whole_reply(bridge: Bridge, request: Request, req: ServedRequest,
                      q: asyncio.Queue[Delta | Finished | Closed]) -> tuple[str, Finished] | Response:
    """The whole reply, or what an OpenAI client gets instead: 503 if the server stops first, nothing (499)
    if the client left."""
    got = await bridge.collect(request, req, q)
    if got is None:
        return Response(status_code=499)
    if isinstance(got, Closed):
        return closed_response(got)
    return got


def add_openai_routes(app: FastAPI, bridge: Bridge) -> None:
    model = bridge.model

    async def read(request: Request, model_type: type[SamplingFields]) -> tuple[Any, str | None]:
        body = validated(model_type, parse_json(await request.body()))
        return body, request.headers.get(AGENT_HEADER) or body.user or None

    @app.get("/v1/models", summary="the loaded model (a request naming another is served by it)")
    async def models() -> Any:
        if bridge.runner.error:  # a client that lists models to see whether the server works learns it does not
            return JSONResponse(error_body(f"the engine stopped: {bridge.runner.error}", "server_error", None,
                                           "engine_stopped"), status_code=503)
        # meta, as llama-server's: how prompts are rendered and which call format replies are read for (a
        # template of an unknown family is offered and read in the Hermes format)
        return {"object": "list", "data": [{"id": model, "object": "model", "created": bridge.created,
                                             "owned_by": "swarmtune",
                                             "meta": {"chat_template": bridge.renderer.how,
                                                      "tool_call_format": bridge.renderer.picked.label}}]}

    @app.post("/v1/chat/completions", summary="OpenAI chat completions: each conversation is an agent",
              response_class=Response)
    async def chat_completions(request: Request) -> Response:
        try:
            body, key = await read(request, ChatRequest)
            if not body.messages:
                raise BadRequest("messages is empty: a chat needs at least one message", "messages")
            choice = body.tool_choice.function.name if isinstance(body.tool_choice, NamedToolChoice) else (
                body.tool_choice or "auto")
            fmt = body.response_format
            if fmt is not None and fmt.type == "json_schema" and (fmt.json_schema is None or
                                                                    fmt.json_schema.schema_ is None):
                raise BadRequest("response_format json_schema needs json_schema.schema", "response_format")
            plan = plan_tools([t.model_dump(exclude_none=True) for t in body.tools or []], choice, bridge.fmt,
                              body.parallel_tool_calls, fmt.json_schema.schema_ if fmt and fmt.json_schema else None,
                              json_output=fmt is not None and fmt.type != "text")
            variables = template_variables(body.chat_template_kwargs, body.reasoning_effort)
            prompt = await bridge.prompt([normalised(m) for m in body.messages], plan.offered, limit=body.limit(),
                                         variables=variables)
            reader = bridge.reader(plan, prompt)
            req = bridge.request(prompt, body.limit(), sampling_of(body), body.stops(), key, "chat",
                                 *bridge.held(plan, reader), reader=reader)
            q = bridge.submit(req)
        except BadRequest as e:
            return error_response(e)
        except Busy as e:
            return busy_response(e)
        cid = f"chatcmpl-{req.id}"
        if not body.stream:
            got = await whole_reply(bridge, request, req, q)
            if isinstance(got, Response):
                return got
            text_out, fin = got
            reply = reader.whole(text_out)
            calls = reply.calls
            message: dict[str, Any] = {"role": "assistant",
                                       "content": reply.content if reply.content or not calls else None}
            if reply.reasoning:
                message["reasoning_content"] = reply.reasoning
            if calls:
                message["tool_calls"] = [{k: v for k, v in c.to_openai(i).items() if k != "index"}
                                         for i, c in enumerate(calls)]
            return JSONResponse({
                "id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
                "choices": [{"index": 0, "message": message, "logprobs": None,
                             "finish_reason": "tool_calls" if calls else fin.reason}],
                "usage": usage_body(fin.usage), "system_fingerprint": None, "swarmtune": account(req),
            })
        include_usage = bool(body.stream_options and body.stream_options.include_usage)

        async def stream() -> AsyncIterator[bytes]:
            now = int(time.time())

            def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
                c: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk", "created": now, "model": model,
                                     "system_fingerprint": None,
                                     "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                  "finish_reason": finish}]}
                if include_usage:
                    c["usage"] = None
                return c

            yield sse(chunk({"role": "assistant", "content": ""}, None))
            reply = reader.stream()

            def deltas(d: Reply) -> Iterator[bytes]:
                if d.reasoning:
                    yield sse(chunk({"reasoning_content": d.reasoning}, None))
                if d.content:
                    yield sse(chunk({"content": d.content}, None))
                first = len(reply.calls) - len(d.calls)
                for i, c in enumerate(d.calls, start=first):  # a call goes out whole, once it is one
                    yield sse(chunk({"tool_calls": [c.to_openai(i)]}, None))

            async for ev in bridge.events(req, q):
                if isinstance(ev, Delta):
                    for out in deltas(reply.feed(ev.text)):
                        yield out
                elif isinstance(ev, Closed):  # OpenAI's way to fail a stream midway: an error event, then the end
                    yield sse(error_body(ev.message, "server_error", None, "shutting_down"))
                else:
                    for out in deltas(reply.finish()):
                        yield out
                    yield sse(chunk({}, "tool_calls" if reply.calls else ev.reason))
                    if include_usage:
                        yield sse({"id": cid, "object": "chat.completion.chunk", "created": now, "model": model,
                                   "system_fingerprint": None, "choices": [], "usage": usage_body(ev.usage),
                                   "swarmtune": account(req)})
            yield sse("[DONE]")

        return StreamingResponse(stream(), media_type="text/event-stream", headers=SSE_HEADERS)

    @app.post("/apply-template", summary="the prompt a chat renders to, as llama-server's /apply-template",
              response_class=Response)
    async def apply_template(request: Request) -> Response:
        try:
            body = validated(TemplateRequest, parse_json(await request.body()))
            if not body.messages:
                raise BadRequest("messages is empty: a chat needs at least one message", "messages")
            tools = [t.model_dump(exclude_none=True) for t in body.tools or []] or None
            variables = template_variables(body.chat_template_kwargs, body.reasoning_effort)
            text = bridge.render([normalised(m) for m in body.messages], tools, variables=variables)
        except BadRequest as e:
            return error_response(e)
        return JSONResponse({"prompt": text})

    @app.post("/v1/completions", summary="OpenAI (legacy) completions over a raw prompt", response_class=Response)
    async def completions(request: Request) -> Response:
        try:
            body, key = await read(request, CompletionRequest)
            p = body.prompt
            if isinstance(p, list) and p and isinstance(p[0], str):
                if len(p) != 1:
                    raise BadRequest(f"prompt takes one string (got {len(p)}): one choice per request", "prompt")
                p = p[0]
            if isinstance(p, str):
                prompt = await bridge.tokenize(p)
            else:
                prompt = [int(t) for t in p]
                n_vocab = getattr(bridge.backend, "n_vocab", None)
                if n_vocab is not None and any(not 0 <= t < n_vocab for t in prompt):
                    raise BadRequest(f"prompt holds a token id outside the vocabulary (0..{n_vocab - 1})", "prompt")
            req = bridge.request(prompt, body.limit(), sampling_of(body), body.stops(), key, "completions",
                                 prompt_param="prompt")
            q = bridge.submit(req)
        except BadRequest as e:
            return error_response(e)
        except Busy as e:
            return busy_response(e)
        cid = f"cmpl-{req.id}"
        echo = body.prompt if body.echo and isinstance(body.prompt, str) else ""
        if not body.stream:
            got = await whole_reply(bridge, request, req, q)
            if isinstance(got, Response):
                return got
            text_out, fin = got
            return JSONResponse({
                "id": cid, "object": "text_completion", "created": int(time.time()), "model": model,
                "choices": [{"index": 0, "text": echo + text_out, "logprobs": None, "finish_reason": fin.reason}],
                "usage": usage_body(fin.usage), "swarmtune": account(req),
            })
        include_usage = bool(body.stream_options and body.stream_options.include_usage)

        async def stream() -> AsyncIterator[bytes]:
            now = int(time.time())

            def chunk(text: str, finish: str | None) -> dict[str, Any]:
                return {"id": cid, "object": "text_completion", "created": now, "model": model,
                        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}

            if echo:
                yield sse(chunk(echo, None))
            async for ev in bridge.events(req, q):
                if isinstance(ev, Delta):
                    yield sse(chunk(ev.text, None))
                elif isinstance(ev, Closed):
                    yield sse(error_body(ev.message, "server_error", None, "shutting_down"))
                else:
                    yield sse(chunk("", ev.reason))
                    if include_usage:
                        yield sse({"id": cid, "object": "text_completion", "created": now, "model": model,
                                   "choices": [], "usage": usage_body(ev.usage), "swarmtune": account(req)})
            yield sse("[DONE]")

        return StreamingResponse(stream(), media_type="text/event-stream", headers=SSE_HEADERS)

"""OpenAI's API over the served agents: POST /v1/chat/completions and /v1/completions (streamed as
Server-Sent Events or not), GET /v1/models. Each request becomes a `ServedRequest` (engine/served.py);
its tokens come back through an asyncio queue fed from the engine's thread."""

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from swarmtune.engine.sampling import SamplingParams
from swarmtune.engine.served import Busy, Closed, Delta, Finished, ServedAgents, ServedRequest, Usage
from swarmtune.engine.server.openai_schema import (
    BadRequest,
    ChatRequest,
    CompletionRequest,
    SamplingFields,
    error_body,
    error_response,
    parse_json,
    validated,
)
from swarmtune.engine.server.runner import EngineRunner

AGENT_HEADER = "x-swarmtune-agent"  # pins a conversation to an agent, as the request's `user` does


def model_id(header_path: str) -> str:
    """What /v1/models calls the loaded model: its file's name, as llama-server names it by default."""
    return Path(header_path).name if header_path else "swarmtune"


def _usage(u: Usage) -> dict[str, Any]:
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}


def add_openai_routes(app: FastAPI, runner: EngineRunner, served: ServedAgents) -> None:
    engine = runner.engine
    backend = engine.backend
    model = model_id(engine.facts.path)
    created = int(time.time())

    def sampling(body: SamplingFields) -> SamplingParams:
        # what a field left out means: llama-server's defaults, which its users' agents are tuned on
        return SamplingParams(
            temperature=body.temperature if body.temperature is not None else 0.8,
            top_k=body.top_k if body.top_k is not None else 40,
            top_p=body.top_p if body.top_p is not None else 0.95,
            min_p=body.min_p if body.min_p is not None else 0.05,
            seed=body.seed if body.seed is not None else time.monotonic_ns() & 0x7FFFFFFF,
            presence_penalty=body.presence_penalty or 0.0,
            frequency_penalty=body.frequency_penalty or 0.0,
        )

    def make_request(prompt: list[int], body: SamplingFields, limit: int | None, key: str | None,
                     endpoint: str) -> ServedRequest:
        ctx = engine.s.ctx_per_agent
        if not prompt:
            raise BadRequest("the prompt is empty", "prompt" if endpoint == "completions" else "messages")
        if len(prompt) + 2 > ctx:
            raise BadRequest(f"the prompt is {len(prompt)} tokens; an agent's context holds {ctx} (--ctx), "
                             "one generated token included", "messages" if endpoint == "chat" else "prompt",
                             code="context_length_exceeded")
        room = ctx - 2 - len(prompt)
        if limit is not None and limit > room:
            raise BadRequest(f"max_tokens {limit} is past the context: the prompt is {len(prompt)} tokens and an "
                             f"agent's context holds {ctx} (--ctx), so at most {room}", "max_tokens",
                             code="context_length_exceeded")
        body.check_supported()
        return ServedRequest(prompt=prompt, max_tokens=limit if limit is not None else room,
                             params=sampling(body), stop=body.stops(), key=key, endpoint=endpoint)

    async def read(request: Request, model_type: type[SamplingFields]) -> tuple[Any, str | None]:
        raw = await request.body()
        body = validated(model_type, parse_json(raw))
        key = request.headers.get(AGENT_HEADER) or body.user or None
        return body, key

    def submit(req: ServedRequest) -> asyncio.Queue:
        if runner.error:
            raise BadRequest(f"the engine stopped: {runner.error}", status=503, code="engine_stopped")
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()

        def emit(event: Delta | Finished | Closed) -> None:
            try:
                loop.call_soon_threadsafe(q.put_nowait, event)
            except RuntimeError:  # the server's loop is gone (shutting down): nobody is listening
                pass

        req.emit = emit
        served.submit(req)
        return q

    def busy_response(e: Busy) -> JSONResponse:
        return JSONResponse(error_body(str(e), "server_error", None, "overloaded"), status_code=503,
                            headers={"Retry-After": str(e.retry_after_s)})

    async def collect(request: Request, req: ServedRequest, q: asyncio.Queue) -> tuple[str, Finished] | Closed | None:
        """The whole reply; Closed if the server stops first; None if the client left first (its request is
        cancelled)."""
        parts: list[str] = []
        while True:
            try:
                ev = await asyncio.wait_for(q.get(), timeout=1.0)
            except TimeoutError:
                if await request.is_disconnected():
                    served.cancel(req)
                    return None
                continue
            if isinstance(ev, Delta):
                parts.append(ev.text)
            elif isinstance(ev, Closed):
                return ev
            else:
                return "".join(parts), ev

    async def events(req: ServedRequest, q: asyncio.Queue) -> AsyncIterator[Delta | Finished | Closed]:
        """The reply as it comes; the request is cancelled if the client leaves before its end."""
        done = False
        try:
            while True:
                ev = await q.get()
                yield ev
                if isinstance(ev, Finished | Closed):
                    done = True
                    return
        finally:
            if not done:
                served.cancel(req)

    def sse(obj: dict[str, Any] | str) -> bytes:
        return f"data: {obj if isinstance(obj, str) else json.dumps(obj, separators=(',', ':'))}\n\n".encode()

    @app.get("/v1/models", summary="the loaded model (a request naming another is served by it)")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model, "object": "model", "created": created,
                                             "owned_by": "swarmtune"}]}

    @app.post("/v1/chat/completions", summary="OpenAI chat completions: each conversation is an agent",
              response_class=Response)
    async def chat_completions(request: Request) -> Response:
        try:
            body, key = await read(request, ChatRequest)
            if not body.messages:
                raise BadRequest("messages is empty: a chat needs at least one message", "messages")
            text = backend.chat([{"role": "system" if m.role == "developer" else m.role, "content": m.text()}
                                 for m in body.messages], add_assistant=True)
            prompt = await asyncio.to_thread(backend.tokenize, text)
            req = make_request(prompt, body, body.limit(), key, "chat")
            q = submit(req)
        except BadRequest as e:
            return error_response(e)
        except Busy as e:
            return busy_response(e)
        cid = f"chatcmpl-{req.id}"
        if not body.stream:
            got = await collect(request, req, q)
            if got is None:
                return Response(status_code=499)
            if isinstance(got, Closed):
                return JSONResponse(error_body(got.message, "server_error", None, "shutting_down"), status_code=503)
            text_out, fin = got
            return JSONResponse({
                "id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text_out}, "logprobs": None,
                             "finish_reason": fin.reason}],
                "usage": _usage(fin.usage), "system_fingerprint": None,
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
            async for ev in events(req, q):
                if isinstance(ev, Delta):
                    yield sse(chunk({"content": ev.text}, None))
                elif isinstance(ev, Closed):  # OpenAI's way to fail a stream midway: an error event, then the end
                    yield sse(error_body(ev.message, "server_error", None, "shutting_down"))
                else:
                    yield sse(chunk({}, ev.reason))
                    if include_usage:
                        yield sse({"id": cid, "object": "chat.completion.chunk", "created": now, "model": model,
                                   "system_fingerprint": None, "choices": [], "usage": _usage(ev.usage)})
            yield sse("[DONE]")

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

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
                prompt = await asyncio.to_thread(backend.tokenize, p)
            else:
                prompt = [int(t) for t in p]
                n_vocab = getattr(backend, "n_vocab", None)
                if n_vocab is not None and any(not 0 <= t < n_vocab for t in prompt):
                    raise BadRequest(f"prompt holds a token id outside the vocabulary (0..{n_vocab - 1})", "prompt")
            req = make_request(prompt, body, body.limit(), key, "completions")
            q = submit(req)
        except BadRequest as e:
            return error_response(e)
        except Busy as e:
            return busy_response(e)
        cid = f"cmpl-{req.id}"
        echo = body.prompt if body.echo and isinstance(body.prompt, str) else ""
        if not body.stream:
            got = await collect(request, req, q)
            if got is None:
                return Response(status_code=499)
            if isinstance(got, Closed):
                return JSONResponse(error_body(got.message, "server_error", None, "shutting_down"), status_code=503)
            text_out, fin = got
            return JSONResponse({
                "id": cid, "object": "text_completion", "created": int(time.time()), "model": model,
                "choices": [{"index": 0, "text": echo + text_out, "logprobs": None, "finish_reason": fin.reason}],
                "usage": _usage(fin.usage),
            })
        include_usage = bool(body.stream_options and body.stream_options.include_usage)

        async def stream() -> AsyncIterator[bytes]:
            now = int(time.time())

            def chunk(text: str, finish: str | None) -> dict[str, Any]:
                return {"id": cid, "object": "text_completion", "created": now, "model": model,
                        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}

            if echo:
                yield sse(chunk(echo, None))
            async for ev in events(req, q):
                if isinstance(ev, Delta):
                    yield sse(chunk(ev.text, None))
                elif isinstance(ev, Closed):
                    yield sse(error_body(ev.message, "server_error", None, "shutting_down"))
                else:
                    yield sse(chunk("", ev.reason))
                    if include_usage:
                        yield sse({"id": cid, "object": "text_completion", "created": now, "model": model,
                                   "choices": [], "usage": _usage(ev.usage)})
            yield sse("[DONE]")

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

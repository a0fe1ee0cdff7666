"""`swarmtune serve`: the engine headless behind an HTTP API (FastAPI on uvicorn).

GET /v1/info, GET /v1/state, GET /v1/steps (Server-Sent Events, resumable with Last-Event-ID),
POST /v1/control, GET /metrics (Prometheus), and the OpenAPI schema; with served agents (--clients),
OpenAI's /v1/chat/completions, /v1/completions and /v1/models (swarmtune/server/openai_api.py). With a
token, every endpoint but /metrics needs `Authorization: Bearer <token>`."""

import asyncio
import hmac
import ipaddress
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal

import uvicorn
from fastapi import FastAPI, Header, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sse_starlette.sse import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

import swarmtune
from swarmtune.engine.agents.served import ServedAgents
from swarmtune.engine.backends.backend import MAX_DRAFT_TOKENS
from swarmtune.engine.control import Control, EngineState
from swarmtune.engine.errors import UserError
from swarmtune.engine.kv.types import KV_TYPES
from swarmtune.engine.settings import MAX_AGENTS, RESIDENCY
from swarmtune.server.anthropic_api import add_anthropic_routes
from swarmtune.server.bridge import Bridge, ChatConfig
from swarmtune.server.guard import Guard, GuardPolicy
from swarmtune.server.metrics import make_registry
from swarmtune.server.openai_api import add_openai_routes
from swarmtune.server.openai_schema import BadRequest, error_body, parse_json
from swarmtune.server.requests_api import add_request_routes
from swarmtune.server.responses_api import add_responses_routes
from swarmtune.server.runner import DIED, EngineRunner
from swarmtune.server.worker_api import add_worker_routes

OPEN_PATHS = ("/metrics", "/health")
PAUSE_WAIT_S = 30.0  # a pause waits for the step in flight, at most this long


class ControlBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # 0 is not false, "3" is not 3
    # the ranges are documented here and checked by the engine (engine/settings.py), so a bad value reads
    # the same line here as from a flag, a key or a typed command
    batch_cap: int | None = Field(default=None, description="at most the number of agents",
                                  json_schema_extra={"minimum": 1, "maximum": MAX_AGENTS})
    kv_type: str | None = Field(  # null: unchanged
        default=None, description="a KV type (K and V alike) or K/V types apart, K first: q8_0, q8_0/f16",
        json_schema_extra={"pattern": "^(" + "|".join(KV_TYPES) + ")(/(" + "|".join(KV_TYPES) + "))?$",
                           "examples": ["q8_0", "q8_0/f16"]})
    agents: int | None = Field(default=None, json_schema_extra={"minimum": 1, "maximum": MAX_AGENTS})
    residency: str | None = Field(default=None, json_schema_extra={"enum": [*RESIDENCY, None]},
                                  description="where a waiting agent's history lives")
    autotune: bool | None = Field(default=None, description="the tuner on or off (its objective is the server's)")
    draft: int | Literal["auto"] | None = Field(
        default=None, description="speculation: the most tokens an agent drafts into a decode step (0: off), or "
                                  "auto: each agent's length where the measured step times say it pays",
        json_schema_extra={"minimum": 0, "maximum": MAX_DRAFT_TOKENS})
    paused: bool | None = None


class Settings(BaseModel):
    batch_cap: int
    kv_type: str
    agents: int
    residency: str
    autotune: bool | None  # None: this engine has no tuner
    draft: int | Literal["auto"] | None = None  # None: the engine does not say
    paused: bool


def _settings(st: EngineState, paused: bool) -> Settings:
    draft: int | Literal["auto"] | None = None if st.draft is None else ("auto" if st.draft.auto else st.draft.tokens)
    return Settings(batch_cap=st.batch_cap, kv_type=st.kv_label, agents=st.agents, residency=st.residency,
                    autotune=st.autotune, draft=draft, paused=paused)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class BearerAuth:
    """Pure ASGI, so it guards the streaming endpoint and the OpenAPI routes alike."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode() if token else None
        self.key = token.encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.expected is None or scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        got = headers.get(b"authorization", b"")
        key = headers.get(b"x-api-key")  # Anthropic's clients send the key so
        if hmac.compare_digest(got, self.expected) or (key is not None and self.key is not None
                                                       and hmac.compare_digest(key, self.key)):
            return await self.app(scope, receive, send)
        # OpenAI's error shape: an OpenAI client shows its message ("detail" kept for older swarmtune clients)
        resp = JSONResponse({"error": {"message": "missing or wrong API key: send it as 'Authorization: Bearer "
                                                  "<token>'", "type": "invalid_request_error", "param": None,
                                       "code": "invalid_api_key"},
                             "detail": "missing or wrong bearer token"}, status_code=401,
                            headers={"WWW-Authenticate": "Bearer"})
        await resp(scope, receive, send)


class ApiServer(uvicorn.Server):
    """uvicorn, ending every served request as its shutdown begins: it waits for open connections before it
    stops the app, and a stream waiting on an engine that is stopping would hold it until its timeout."""

    def __init__(self, config: uvicorn.Config, served: ServedAgents | None) -> None:
        super().__init__(config)
        self.served = served

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.served is not None:
            self.served.close_all()
        await super().shutdown(sockets)


def _invalid(field: str, msg: str) -> JSONResponse:
    return JSONResponse({"detail": [{"loc": ["body", field], "msg": msg, "type": "value_error"}]}, status_code=422)


def make_app(runner: EngineRunner, token: str | None = None, served: ServedAgents | None = None,
             allow_hosts: tuple[str, ...] = (), allow_origins: tuple[str, ...] = (),
             chat: ChatConfig | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not runner.running and not runner.ready.is_set():
            runner.start()
        yield
        if not runner.hosted:  # a host (the dashboard) stops its own engine
            await asyncio.to_thread(runner.stop)

    app = FastAPI(title="swarmtune", version=swarmtune.__version__, lifespan=lifespan,
                  responses={401: {"description": "missing or wrong bearer token (when the server has one)"}},
                  description="A swarm of agents decoding through one engine: steps, settings, metrics.")
    registry = make_registry(runner)

    @app.get("/v1/info", summary="the record header: model, W, k per cache type, settings")
    async def info() -> dict[str, Any]:
        await asyncio.to_thread(runner.ready.wait, 120)
        if runner.error and not runner.header:
            raise HTTPException(status_code=503, detail=runner.error)
        return runner.header

    @app.get("/v1/state", summary="the latest step record and the settings in force")
    async def state() -> dict[str, Any]:
        r = runner.latest
        st = runner.engine.state()
        return {
            "step": json.loads(runner.public_json(r)) if r else None,
            "settings": _settings(st, runner.paused).model_dump(),
            "tokens_per_second": runner.rolling.tokens_per_second,
            "error": runner.error,
        }

    @app.get("/v1/steps", summary="Server-Sent Events, one per step record; resumable with Last-Event-ID",
             response_class=Response, responses={200: {"content": {"text/event-stream": {}}}})
    async def steps(
        request: Request,
        last_event_id: str | None = Header(default=None, pattern=r"^[0-9]{1,12}$", description="resume after it"),
        from_step: int | None = Query(default=None, alias="from", ge=0, description="first step to send"),
        limit: int | None = Query(default=None, ge=1, le=100_000, description="close after this many events"),
    ) -> EventSourceResponse:
        start = from_step
        if start is None and last_event_id:
            start = int(last_event_id) + 1
        sub = runner.subscribe(asyncio.get_running_loop())
        backlog = runner.since(start) if start is not None else []

        async def events() -> AsyncIterator[dict[str, str]]:
            last, sent = (start - 1 if start is not None else -1), 0
            try:
                for step, line in backlog:
                    yield {"id": str(step), "event": "step", "data": line}
                    last, sent = step, sent + 1
                    if limit and sent >= limit:
                        return
                if runner.error:
                    yield {"event": "error", "data": json.dumps({"error": f"the engine stopped: {runner.error}"})}
                    return
                while True:
                    step, line = await sub.queue.get()
                    if step == DIED:  # the engine died: this stream has nothing more to wait for
                        yield {"event": "error", "data": line}
                        return
                    if step <= last:
                        continue
                    yield {"id": str(step), "event": "step", "data": line}
                    last, sent = step, sent + 1
                    if limit and sent >= limit:
                        return
            finally:
                runner.unsubscribe(sub)

        return EventSourceResponse(events(), ping=10, send_timeout=30)

    @app.post("/v1/control", response_model=Settings, summary="change batch cap, KV type, agents or pause",
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": ControlBody.model_json_schema()}}}},
              responses={400: {"description": "the body is not a JSON object: one line in `detail`"},
                         413: {"description": "the body is past 64 KiB"},
                         422: {"description": "a field is wrong: `detail` names it, as FastAPI does"},
                         503: {"description": "a pause that did not hold within 30 s (a long step in flight)"}})
    async def control(request: Request) -> JSONResponse | Settings:
        # parsed here, not by FastAPI: the same checks as the chat routes' (depth, numbers, UTF-8), each a line
        try:
            body = ControlBody.model_validate(parse_json(await request.body()))
        except BadRequest as e:
            return JSONResponse({"detail": str(e)}, status_code=400)
        except ValidationError as e:
            err = e.errors()[0]
            return _invalid(".".join(str(x) for x in err["loc"]) or "body", err["msg"])
        st = runner.engine.state()
        try:  # validated by the engine, in one place: the same line as from a flag, a key or a typed command
            if c := Control.from_http(body.model_dump(exclude={"paused"})):
                st = runner.engine.request(c)
        except UserError as e:
            return _invalid(e.field or "body", str(e))
        if body.paused is not None:
            runner.paused = body.paused
            if body.paused and runner.running and not runner.error:
                # answer once it holds: the step in flight done and published, none after this answer
                if not await asyncio.to_thread(runner.source.wait_held, PAUSE_WAIT_S):
                    return JSONResponse({"detail": f"the pause did not hold within {PAUSE_WAIT_S:.0f} s (a long "
                                                   "step in flight); it holds after it"}, status_code=503)
        return _settings(st, runner.paused)

    @app.get("/health", summary="200 while the engine runs; 503 while it loads or after it stopped",
             responses={503: {"description": "loading, or the engine stopped (the cause: /v1/state)"}})
    async def health() -> JSONResponse:
        # open without the token, as /metrics (a supervisor's probe has none): the status only, no cause
        if runner.error:
            return JSONResponse({"status": "error"}, status_code=503)
        if not runner.ready.is_set():
            return JSONResponse({"status": "loading"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics", summary="Prometheus exposition", response_class=Response,
             responses={200: {"content": {"text/plain": {}}}})
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    if served is not None:
        bridge = Bridge(runner, served, chat or ChatConfig())
        add_openai_routes(app, bridge)
        add_anthropic_routes(app, bridge)
        add_responses_routes(app, bridge)
        add_request_routes(app, served)
        add_worker_routes(app, runner)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # an OpenAI client reads OpenAI's shape; swarmtune's own clients read "detail"
        routeless = exc.status_code == 404 and exc.detail == "Not Found"  # Starlette's own, not a route's
        msg = f"no route {request.method} {request.url.path}" if routeless else str(exc.detail)
        return JSONResponse({**error_body(msg, "invalid_request_error", None, str(exc.status_code)),
                             "detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    app.add_middleware(BearerAuth, token=token)
    # outermost: a foreign Host, a cross-site page or an oversized body is refused before anything else runs
    app.add_middleware(Guard, policy=GuardPolicy(token=token, allow_hosts=tuple(h.lower() for h in allow_hosts),
                                                 allow_origins=allow_origins))
    return app

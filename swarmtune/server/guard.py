"""What reaches the routes: the server's front door (pure ASGI, so it guards the streams and the OpenAPI
routes alike, before a byte of a body is parsed).

- **Local means local.** A loopback server without a token answers only requests whose Host is a loopback
  name or address (or one --allow-host names): a web page that rebinds its own domain to 127.0.0.1 (DNS
  rebinding) sends its own name as Host, and is refused. A browser's cross-origin request (an Origin that is
  not the server's own, unless --allow-origin names it) is refused with or without a token: a page may send a
  "simple" POST to any address without asking first.
- **A body is JSON.** A POST whose Content-Type is present and not JSON (text/plain, a form) is refused: those
  are the types a page may send cross-site without a preflight.
- **A body has a size.** At most `limit_bytes` are read, counted as they stream in (a Content-Length past
  it is refused before any is read): the server never holds more than the limit of one request.
Every refusal is one line in the error shape of the API the path belongs to (Anthropic's for /v1/messages,
else OpenAI's with swarmtune's "detail"), and names the flag that would allow it where one does.
"""

import ipaddress
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import urlsplit

from starlette.responses import JSONResponse
from starlette.types import ASGIApp

MAX_BODY_BYTES = 16 * 1024 * 1024  # a prompt this large is far past any agent's context anyway
MAX_CONTROL_BYTES = 64 * 1024  # a control body is a handful of fields
_BODY_METHODS = {"POST", "PUT", "PATCH"}


@dataclass(frozen=True)
class GuardPolicy:
    token: str | None = None
    allow_hosts: tuple[str, ...] = ()  # Host names answered without a token besides loopback ones ("*": any)
    allow_origins: tuple[str, ...] = ()  # browser origins allowed besides the server's own ("*": any)
    body_limits: dict[str, int] = field(default_factory=lambda: {"/v1/control": MAX_CONTROL_BYTES})

    def limit_bytes(self, path: str) -> int:
        return self.body_limits.get(path, MAX_BODY_BYTES)


def host_name(host_header: str) -> str:
    """The name in a Host header, without its port ("[::1]:8765" -> "::1")."""
    h = host_header.strip().lower()
    if h.startswith("["):
        return h[1:h.index("]")] if "]" in h else h[1:]
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def is_loopback_name(name: str) -> bool:
    if name == "localhost" or name.endswith(".localhost"):  # RFC 6761: resolves to loopback only
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def error_response(path: str, status: int, message: str, code: str) -> JSONResponse:
    if path.startswith("/v1/messages"):
        kind = {413: "request_too_large", 403: "permission_error"}.get(status, "invalid_request_error")
        return JSONResponse({"type": "error", "error": {"type": kind, "message": message}}, status_code=status)
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                   "code": code}, "detail": message}, status_code=status)


class Guard:
    def __init__(self, app: ASGIApp, policy: GuardPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
        path = scope["path"]
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            status, message, code = refusal
            return await error_response(path, status, message, code)(scope, receive, send)
        if scope["method"] not in _BODY_METHODS:
            return await self.app(scope, receive, send)
        limit = self.policy.limit_bytes(path)
        try:
            declared = int(headers.get("content-length", "0") or "0")
        except ValueError:
            declared = -1
        if declared < 0 or declared > limit:
            msg = (f"the body is {declared} bytes; at most {limit} are accepted here" if declared > limit
                   else "Content-Length is not a number of bytes")
            return await error_response(path, 413 if declared > limit else 400, msg, "body_too_large")(
                scope, receive, send)
        chunks: list[bytes] = []
        got = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None  # the client left before its body was whole: nothing to answer
            chunk = message.get("body", b"")
            got += len(chunk)
            if got > limit:  # stop reading: the rest is never held
                return await error_response(path, 413, f"the body is past {limit} bytes, the most accepted here",
                                            "body_too_large")(scope, receive, send)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return cast(dict[str, Any], await receive())  # after the body: the disconnect, when it comes

        return await self.app(scope, replay, send)

    def _refusal(self, scope: dict[str, Any], headers: dict[str, str]) -> tuple[int, str, str] | None:
        p = self.policy
        host = headers.get("host", "")
        name = host_name(host)
        if p.token is None and not (is_loopback_name(name) or name in p.allow_hosts or "*" in p.allow_hosts):
            return (403, f"Host {host!r} is not this loopback server's name; to answer it, start the server with "
                         f"--allow-host {name or 'NAME'} (or a token: --token)", "host_not_allowed")
        origin = headers.get("origin")
        if origin is not None and not self._origin_allowed(origin, host, scope):
            return (403, f"a page at {origin} may not call this server from a browser; to allow it, start the "
                         f"server with --allow-origin {origin}", "origin_not_allowed")
        ctype = headers.get("content-type")
        if scope["method"] in _BODY_METHODS and ctype is not None and not _is_json(ctype):
            return (415, f"Content-Type {ctype.split(';')[0].strip()!r} is not JSON: send application/json",
                    "unsupported_media_type")
        return None

    def _origin_allowed(self, origin: str, host: str, scope: dict[str, Any]) -> bool:
        if origin in self.policy.allow_origins or "*" in self.policy.allow_origins:
            return True
        parts = urlsplit(origin)
        # the server's own pages (its /docs) call it from the origin they were loaded from
        return parts.scheme == scope.get("scheme", "http") and parts.netloc.lower() == host.strip().lower() != ""


def _is_json(content_type: str) -> bool:
    media = content_type.split(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))

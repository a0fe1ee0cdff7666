"""A recorded llama-server, served back by a real HTTP server on a loopback port.

Each path is answered with the transcript line whose `t` is the latest not after the replay clock. The
test moves the clock (`at(t)`), so a replay is deterministic and runs as fast as the client polls; or,
for a client that polls on its own timer, each GET /slots moves the clock to the next recorded round."""

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FIXTURE = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "llama-server" / "transcript.jsonl"
# what llama-server answers on /metrics when started without --metrics
NO_METRICS = (501, "application/json; charset=utf-8", json.dumps(
    {"error": {"code": 501, "message": "This server does not support metrics endpoint. Start it with `--metrics`",
               "type": "not_supported_error"}}))


@dataclass(frozen=True)
class Line:
    t: float
    path: str
    status: int
    content_type: str
    body: str


def load(path: Path = FIXTURE) -> list[Line]:
    out = []
    for raw in path.read_text().splitlines():
        if raw.strip():
            d = json.loads(raw)
            out.append(Line(float(d["t"]), d["path"], int(d["status"]), d["content_type"], d["body"]))
    return out


@dataclass
class Replay:
    lines: list[Line]
    metrics: bool = True  # False: answer /metrics as a server without --metrics does
    advance_on_slots: bool = False
    clock: float = 0.0
    requests: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def rounds(self) -> list[float]:
        """The recorded poll rounds: the times of the /slots answers."""
        return sorted({ln.t for ln in self.lines if ln.path == "/slots"})

    def at(self, t: float) -> None:
        with self._lock:
            self.clock = t

    def answer(self, path: str) -> tuple[int, str, str]:
        with self._lock:
            self.requests.append(path)
            if path == "/slots" and self.advance_on_slots:
                later = [t for t in self.rounds if t > self.clock]
                if later and self.requests.count("/slots") > 1:
                    self.clock = later[0]
            if path == "/metrics" and not self.metrics:
                return NO_METRICS
            seen = [ln for ln in self.lines if ln.path == path and ln.t <= self.clock]
            if not seen:
                return 404, "application/json; charset=utf-8", json.dumps(
                    {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})
            ln = max(seen, key=lambda x: x.t)
            return ln.status, ln.content_type, ln.body


@contextmanager
def serve(replay: Replay) -> Iterator[str]:
    """The replay on 127.0.0.1 at an ephemeral port; yields its URL."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            status, ctype, body = replay.answer(self.path.split("?")[0])
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()

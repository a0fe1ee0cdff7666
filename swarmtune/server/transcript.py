"""`serve --clients --transcript FILE`: every served conversation turn written as one JSON line, the exact
tokens its agent's cache held (the client's prompt as the model read it, then what it generated), so
that `swarmtune quality --transcript FILE` measures a KV setting on the traffic the swarm really served.
A line: {"id": ..., "key": ..., "finish_reason": ..., "tokens": [...]}."""

import json
import threading
from pathlib import Path

from swarmtune.engine.agents.served import ServedAgents
from swarmtune.engine.agents.served_request import ServedRequest
from swarmtune.engine.errors import UserError
from swarmtune.engine.record.records import RequestRecord


class TranscriptWriter:
    def __init__(self, path: str) -> None:
        p = Path(path)
        if not p.parent.exists():
            raise UserError(f"cannot write {path}: folder {p.parent} does not exist")
        try:
            self._f = p.open("a", encoding="utf-8")
        except OSError as e:
            raise UserError(f"cannot write {path}: {e.strerror}") from None
        self._lock = threading.Lock()
        self.lines = 0

    def listen(self, served: ServedAgents) -> None:
        """Called as each request ends, after whatever listened before (the metrics)."""
        before = served.on_finish

        def on_finish(req: ServedRequest, rec: RequestRecord) -> None:
            before(req, rec)
            self.write(req, rec)

        served.on_finish = on_finish

    def write(self, req: ServedRequest, rec: RequestRecord) -> None:
        tokens = list(req.prompt[: req.prompt_tokens]) + list(req.generated)
        line = json.dumps({"id": rec.id, "key": rec.key, "finish_reason": rec.finish_reason, "tokens": tokens},
                          separators=(",", ":"))
        with self._lock:
            if self._f.closed:
                return
            self._f.write(line + "\n")
            self._f.flush()  # a killed server loses at most the line being written
            self.lines += 1

    def close(self) -> None:
        with self._lock:
            self._f.close()

"""`GET /v1/requests/{id}`: what one served request cost, after it ended: its prompt's cells by where they
came from (kept as its conversation's prefix, kept past an edit by shift, copied from another agent,
prefilled), why it prefilled what its conversation had held, its seconds and its joules. The record is the
one `--record` writes (docs/records.md); the id is the one its response carried, under any API's prefix."""

import threading
from collections import OrderedDict
from dataclasses import asdict
from typing import Any

from fastapi import FastAPI, HTTPException

from swarmtune.engine.agents.served import ServedAgents
from swarmtune.engine.agents.served_request import ServedRequest
from swarmtune.engine.record.records import RequestRecord

KEPT_RECORDS = 4096
ID_PREFIXES = ("chatcmpl-", "cmpl-", "msg_", "resp_")  # OpenAI chat, completions, Anthropic, Responses


class RequestLedger:
    """The last KEPT_RECORDS ended requests, by id (the engine's thread writes, the server's read)."""

    def __init__(self, served: ServedAgents) -> None:
        self._by_id: OrderedDict[str, RequestRecord] = OrderedDict()
        self._lock = threading.Lock()
        before = served.on_finish

        def on_finish(req: ServedRequest, rec: RequestRecord) -> None:
            before(req, rec)
            with self._lock:
                self._by_id[rec.id] = rec
                while len(self._by_id) > KEPT_RECORDS:
                    self._by_id.popitem(last=False)

        served.on_finish = on_finish

    def get(self, rid: str) -> RequestRecord | None:
        for p in ID_PREFIXES:
            rid = rid.removeprefix(p)
        with self._lock:
            return self._by_id.get(rid)


def add_request_routes(app: FastAPI, served: ServedAgents) -> None:
    ledger = RequestLedger(served)

    @app.get("/v1/requests/{rid}", summary="one ended request's account: cells reused and how, why it missed, "
             "seconds, joules", responses={404: {"description": "unknown, not ended yet, or older than the last "
                                                                f"{KEPT_RECORDS}"}})
    async def request_account(rid: str) -> dict[str, Any]:
        rec = ledger.get(rid)
        if rec is None:
            raise HTTPException(status_code=404, detail=f"no ended request {rid[:64]!r} (the server keeps the "
                                f"last {KEPT_RECORDS}; a request is here once its reply has ended)")
        return asdict(rec)

"""A client for `swarmtune serve`: httpx for the calls, httpx-sse for the step stream."""

import json
from collections.abc import Iterator
from typing import Any, cast

import httpx
from httpx_sse import connect_sse

from swarmtune.engine.errors import UserError
from swarmtune.engine.record.records import StepRecord, step_from_dict


class SwarmClient:
    def __init__(self, url: str, token: str | None = None, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def _get(self, path: str) -> dict[str, Any]:
        r = self.http.get(path)
        self._check(r)
        return cast(dict[str, Any], r.json())

    @staticmethod
    def _check(r: httpx.Response) -> None:
        if r.status_code == 401:
            raise UserError("the server wants a token: pass --token (or SWARMTUNE_TOKEN)")
        if r.status_code == 422:
            detail = r.json().get("detail")
            if isinstance(detail, list) and detail:
                d = detail[0]
                raise UserError(f"{d.get('loc', ['?'])[-1]}: {d.get('msg')}")
            raise UserError(str(detail))
        r.raise_for_status()

    def info(self) -> dict[str, Any]:
        return self._get("/v1/info")

    def state(self) -> dict[str, Any]:
        return self._get("/v1/state")

    def control(self, **body: object) -> dict[str, Any]:
        r = self.http.post("/v1/control", json={k: v for k, v in body.items() if v is not None})
        self._check(r)
        return cast(dict[str, Any], r.json())

    def steps(self, from_step: int | None = None, limit: int | None = None) -> Iterator[StepRecord]:
        params: dict[str, int] = {}
        if from_step is not None:
            params["from"] = from_step
        if limit is not None:
            params["limit"] = limit
        timeout = httpx.Timeout(10.0, read=60.0)  # the server pings every 10 s
        with connect_sse(self.http, "GET", "/v1/steps", params=params, timeout=timeout) as es:
            self._check(es.response)
            for ev in es.iter_sse():
                if ev.event == "step":
                    yield step_from_dict(json.loads(ev.data))

    def close(self) -> None:
        self.http.close()

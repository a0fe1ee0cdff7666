"""A control sent to fleet nodes: each through its own `POST /v1/control`, with its own token, all at once,
and each node's answer kept apart (a refusal from one does not hide what the others did)."""

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx

from swarmtune.engine.control import Control

CONTROL_TIMEOUT_S = 35.0  # past the server's own 30 s wait for a pause to hold: a wait always ends


@dataclass(frozen=True)
class NodeAnswer:
    instance: str
    ok: bool
    line: str  # what it now runs with, or why it refused (one line)


def _answer(instance: str, control: Control, token: str | None, timeout_s: float) -> NodeAnswer:
    url = instance if instance.startswith(("http://", "https://")) else f"http://{instance}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        r = httpx.post(url.rstrip("/") + "/v1/control", json=control.to_http(), headers=headers, timeout=timeout_s)
    except (httpx.HTTPError, httpx.InvalidURL) as e:  # an instance label that is not host:port is the latter
        return NodeAnswer(instance, False, f"did not answer ({type(e).__name__})")
    try:
        body = r.json()
    except ValueError:
        body = None
    if r.status_code == 200 and isinstance(body, dict):
        autotune = body.get("autotune")
        tuner = "none" if autotune is None else "on" if autotune else "off"  # None: the node has no tuner
        return NodeAnswer(instance, True, f"kv {body.get('kv_type')}, cap {body.get('batch_cap')}, agents "
                                          f"{body.get('agents')}, tuner {tuner}")
    if r.status_code == 401:
        return NodeAnswer(instance, False, "wants a token: --token, or --node-token HOST:PORT=TOKEN")
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, list) and detail and isinstance(detail[0], dict):  # FastAPI's shape: the field, the line
        detail = f"{detail[0].get('loc', ['?'])[-1]}: {detail[0].get('msg')}"
    return NodeAnswer(instance, False, f"refused (HTTP {r.status_code}): {detail or 'no detail'}")


def send_control(control: Control, instances: Sequence[str], tokens: Mapping[str, str],
                 default_token: str | None = None, timeout_s: float = CONTROL_TIMEOUT_S) -> list[NodeAnswer]:
    """Send one change to every node named, in parallel; the answers in the order named."""
    if not instances:
        return []
    with ThreadPoolExecutor(max_workers=min(16, len(instances))) as pool:
        return list(pool.map(lambda i: _answer(i, control, tokens.get(i, default_token), timeout_s), instances))

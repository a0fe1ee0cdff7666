"""Engines people already run, read-only: llama.cpp's llama-server and vLLM, polled over HTTP and
turned into step records so the same panels can show them.

What the remote does not tell (W, k) comes from the user: --gguf PATH, or --weight-bytes and
--kv-bytes-per-token. Every record is labelled measured:<engine> (the remote's own counters)."""

import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from engine.records import AgentView, StepRecord


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text to {sample name: value}, summed over label sets."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name] = out.get(s.name, 0.0) + float(s.value)
    return out


def _slot_context(slot: dict) -> tuple[int, int]:
    """(tokens in the slot's cache, tokens decoded this task). While processing, llama-server counts the
    cached and the newly processed prompt apart, and its n_prompt_tokens may already include decoded tokens."""
    nt = slot.get("next_token") or [{}]
    nt = nt[0] if isinstance(nt, list) and nt else (nt if isinstance(nt, dict) else {})
    decoded = int(nt.get("n_decoded", 0) or 0)
    if slot.get("is_processing") and "n_prompt_tokens_processed" in slot:
        ctx = int(slot.get("n_prompt_tokens_cache", 0) or 0) + int(slot.get("n_prompt_tokens_processed", 0)) + decoded
    else:
        ctx = int(slot.get("n_prompt_tokens", 0) or 0) + decoded
    return ctx, decoded


class ForeignPoller:
    """Base: one poll is one record; its `t` is wall time since the first poll."""

    engine = ""

    def __init__(self, url: str, weight_bytes: float | None, kv_bytes_per_token: float | None,
                 timeout_s: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, timeout=timeout_s)
        self.weight_bytes = weight_bytes
        self.k = kv_bytes_per_token
        self.step = 0
        self.t0 = time.perf_counter()
        self._last: dict[str, float] = {}
        self._last_t: float | None = None

    def header(self) -> dict:
        kv = {"remote": self.k} if self.k else {}
        return {
            "model": {"name": self.model_name(), "path": self.url, "architecture": "remote"},
            "weight_bytes": self.weight_bytes or 0,
            "kv_bytes_per_token": kv,
            "backend": self.engine, "device": self.url, "versions": {}, "settings": {},
            "source": f"measured:{self.engine}", "read_only": True,
            "power": {"source": None, "detail": f"n/a: {self.engine} does not report power"},
        }

    def model_name(self) -> str:
        return self.engine

    def _rate(self, counters: dict[str, float], tokens_key: str) -> tuple[float, float]:
        """Tokens and seconds since the previous poll, from a cumulative token counter."""
        now = time.perf_counter()
        tokens = counters.get(tokens_key, 0.0) - self._last.get(tokens_key, counters.get(tokens_key, 0.0))
        seconds = now - self._last_t if self._last_t is not None else 0.0
        self._last, self._last_t = counters, now
        return max(tokens, 0.0), seconds

    def _record(self, agents: list[AgentView], batch_ids: list[int], tokens: float, seconds: float,
                batch_cap: int, note: str = "") -> StepRecord:
        k = self.k or 0.0
        ctx = [a.context for a in agents if a.id in batch_ids]
        mean = sum(ctx) / len(ctx) if ctx else 0.0
        rec = StepRecord(
            step=self.step, t=round(time.perf_counter() - self.t0, 3), kind="decode", batch=len(batch_ids),
            batch_ids=batch_ids, batch_cap=batch_cap, kv_type="remote", agents=agents,
            weight_bytes=int(self.weight_bytes or 0), kv_bytes=sum(ctx) * k, seconds=seconds, tokens=int(tokens),
            source=f"measured:{self.engine}", mean_context=mean,
            tokens_per_second=tokens / seconds if seconds > 0 else None, note=note,
        )
        self.step += 1
        return rec

    def close(self) -> None:
        self.http.close()


class LlamaServerPoller(ForeignPoller):
    engine = "llama-server"

    def model_name(self) -> str:
        try:
            props = self.http.get("/props").json()
        except (httpx.HTTPError, ValueError):
            return "llama-server"
        path = props.get("model_path") or props.get("model_alias") or "llama-server"
        return str(path).rsplit("/", 1)[-1]

    def poll(self) -> StepRecord:
        slots = self.http.get("/slots")
        slots.raise_for_status()
        data = slots.json()
        counters: dict[str, float] = {}
        m = self.http.get("/metrics")
        if m.status_code == 200:  # needs llama-server --metrics
            counters = parse_metrics(m.text)
        agents, busy = [], []
        for s in data:
            ctx, decoded = _slot_context(s)
            sid = int(s.get("id", len(agents)))
            processing = bool(s.get("is_processing"))
            if processing:
                busy.append(sid)
            agents.append(AgentView(id=sid, context=ctx, state="decoding" if processing else "idle",
                                    limit=int(s.get("n_ctx", 0) or 0), generated=decoded, turns=0, tail=""))
        tokens, seconds = self._rate(counters, "llamacpp:tokens_predicted_total")
        return self._record(agents, busy, tokens, seconds, batch_cap=len(data),
                            note="" if counters else "no /metrics: start llama-server with --metrics")


class VllmPoller(ForeignPoller):
    engine = "vllm"

    def model_name(self) -> str:
        try:
            models = self.http.get("/v1/models").json().get("data", [])
            return models[0]["id"] if models else "vllm"
        except (httpx.HTTPError, ValueError, KeyError, IndexError):
            return "vllm"

    def poll(self) -> StepRecord:
        r = self.http.get("/metrics")
        r.raise_for_status()
        c = parse_metrics(r.text)
        running = int(c.get("vllm:num_requests_running", 0))
        waiting = int(c.get("vllm:num_requests_waiting", 0))
        # vLLM reports no per-request contexts: one row per running or waiting request, contexts unknown (0)
        agents = [AgentView(i, 0, "decoding" if i < running else "waiting", 0, 0, 0, "")
                  for i in range(running + waiting)]
        tokens, seconds = self._rate(c, "vllm:generation_tokens_total")
        usage = c.get("vllm:kv_cache_usage_perc")
        note = f"KV cache {usage:.0%} used" if usage is not None else ""
        return self._record(agents, list(range(running)), tokens, seconds, batch_cap=running + waiting, note=note)


def detect(url: str, token: str | None = None, timeout_s: float = 5.0) -> str:
    """swarmtune, llama-server or vllm: which engine answers at url."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=url.rstrip("/"), timeout=timeout_s, headers=headers) as h:
        r = h.get("/v1/info")
        if r.status_code == 200 and "kv_bytes_per_token" in r.text:
            return "swarmtune"
        if r.status_code == 401:
            return "swarmtune"
        r = h.get("/slots")
        if r.status_code == 200 and r.text.lstrip().startswith("["):
            return "llama-server"
        r = h.get("/metrics")
        if r.status_code == 200 and "vllm:" in r.text:
            return "vllm"
        if r.status_code == 200 and "llamacpp:" in r.text:
            return "llama-server"
    return "unknown"

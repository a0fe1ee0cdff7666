"""What a fleet router asks a worker before it routes to it (SGLang's Model Gateway, `sglang-router` on
PyPI, and its fork the vLLM Router): `/health` (server.py), then the model and the server it runs, under
SGLang's names (`/model_info`, `/server_info`) and their older ones (`/get_model_info`,
`/get_server_info`), which the gateway asks in turn. Probed against the real gateway (tests/test_fleet.py):
it registers a worker once `/health` answers 200; these two only name the model and the capacity.

No `model_path` or `tokenizer_path` is given: the gateway would load a Hugging Face tokenizer from it, and a
GGUF's file name is not one (it routes on the request's text without one)."""

from typing import Any

from fastapi import FastAPI

import swarmtune
from swarmtune.server.bridge import model_id
from swarmtune.server.runner import EngineRunner


def add_worker_routes(app: FastAPI, runner: EngineRunner) -> None:
    def model_info() -> dict[str, Any]:
        return {"served_model_name": model_id(runner.engine.facts.path), "is_generation": True,
                "preferred_sampling_params": None, "has_image_understanding": False}

    def server_info() -> dict[str, Any]:
        st = runner.engine.state()
        s = runner.engine.s
        return {"version": swarmtune.__version__, "engine": "swarmtune", "served_model_name":
                model_id(runner.engine.facts.path), "max_running_requests": st.agents,
                "max_total_num_tokens": st.agents * s.ctx_per_agent, "context_length": s.ctx_per_agent,
                "kv_cache_dtype": st.kv_label, "tp_size": 1, "dp_size": 1}

    for path in ("/model_info", "/get_model_info"):
        app.add_api_route(path, model_info, methods=["GET"], summary="a fleet router's probe: the model served")
    for path in ("/server_info", "/get_server_info"):
        app.add_api_route(path, server_info, methods=["GET"], summary="a fleet router's probe: capacity, KV type")

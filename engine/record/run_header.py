"""A run's header: the model, what a step reads of it, the backend and device, the settings in force, the
reference and the power source; the first line of a recording and what every reader starts from."""

from dataclasses import asdict

import swarmtune
from swarmtune.engine.backends.backend import Backend
from swarmtune.engine.measure.power.meter import Meter
from swarmtune.engine.measure.speedup import BatchOneReference
from swarmtune.engine.model.model_facts import ModelFacts
from swarmtune.engine.settings import EngineSettings


def run_header(b: Backend, s: EngineSettings, slots: int, overlap: bool, reference: BatchOneReference,
               meter: Meter, started_at: str, run_id: str) -> dict[str, object]:
    facts = b.facts
    return {
        "model": {"name": facts.name, "path": facts.path, "architecture": facts.architecture},
        "weight_bytes": facts.weight_bytes,
        "embd_row_bytes": facts.embd_row_bytes,
        "kv_bytes_per_token": facts.kv_bytes_per_token_all(),
        # what a step reads, layer by layer: windows, experts, recurrent state (engine/model/bytes_model.py)
        "bytes_model": facts.bytes_model.to_dict(),
        "kv_buffer_bytes_reported": getattr(b, "kv_buffer_bytes", None),
        "cache_bytes_reported": getattr(b, "cache_bytes", None) or None,  # kv, kv_swa, recurrent (llama.cpp log)
        "backend": b.info.name,
        "device": b.info.device,
        "versions": {"swarmtune": swarmtune.__version__, **b.info.versions},
        # overlap as in force (the setting's None: the backend's say)
        "settings": {**asdict(s), "kv": s.kv.label, **b.info.settings, "slots": slots, "overlap": overlap},
        "source": b.source,
        "reference": reference.as_dict(),
        "power": {"source": meter.label, "detail": meter.reason, "tried": getattr(meter, "tried", [])},
        "started_at": started_at,
        "run_id": run_id,  # step indexes restart with each run; a client resuming by index checks it
    }


def preview_header(facts: ModelFacts, s: EngineSettings, source: str, backend: str) -> dict[str, object]:
    """What is known before the model loads (the model file's header and the settings): enough for a screen to
    draw every panel (the formula's curve, the bytes a step reads, a row per agent) while the engine starts.
    `preview` marks it; the engine's own header replaces it."""
    return {
        "model": {"name": facts.name, "path": facts.path, "architecture": facts.architecture},
        "weight_bytes": facts.weight_bytes,
        "kv_bytes_per_token": facts.kv_bytes_per_token_all(),
        "bytes_model": facts.bytes_model.to_dict(),
        "backend": backend,
        "device": "starting",
        "settings": {**asdict(s), "kv": s.kv.label},
        "source": source,
        "power": {"source": "", "detail": "starting"},
        "preview": True,
    }

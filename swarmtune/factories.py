"""What the commands build from their flags: a backend, an engine with its tuner, a remote source."""

import argparse
import os

from swarmtune.engine.errors import UserError
from swarmtune.engine.kv.types import F16


def remote_source(args: argparse.Namespace):
    """A source for whatever engine answers at args.url."""
    import httpx

    from swarmtune.sources.attached import ForeignSource
    from swarmtune.sources.pollers import LlamaServerPoller, VllmPoller, detect
    from swarmtune.sources.remote import RemoteSource

    url = args.url if "://" in args.url else f"http://{args.url}"
    token = args.token or os.environ.get("SWARMTUNE_TOKEN") or None
    try:
        kind = detect(url, token)
    except httpx.HTTPError as e:
        raise UserError(f"cannot reach {url}: {type(e).__name__}") from None
    if kind == "swarmtune":
        from swarmtune.sources.client import SwarmClient

        client = SwarmClient(url, token)
        try:
            client.info()
        except httpx.HTTPError as e:
            raise UserError(f"cannot reach {url}: {type(e).__name__}") from None
        return RemoteSource(client)
    if kind == "unknown":
        raise UserError(f"{url} is not swarmtune serve, llama-server or vLLM (no /v1/info, /slots or vllm: metrics)")
    w, k, bm = args.weight_bytes, args.kv_bytes_per_token, None
    if args.gguf:
        from swarmtune.engine.model.model_facts import read_model_facts

        facts = read_model_facts(args.gguf)
        w = w or facts.weight_bytes
        k = k or facts.kv_bytes_per_token(F16)
        if args.weight_bytes is None and args.kv_bytes_per_token is None:
            bm = facts.bytes_model
    poller = (LlamaServerPoller if kind == "llama-server" else VllmPoller)(url, w, k, bytes_model=bm)
    return ForeignSource(poller)


def make_backend(args: argparse.Namespace):
    """The sim backend for --sim, else llama.cpp on --model (default: the embedded model)."""
    if args.sim and args.model:
        raise UserError("give --model or --sim, not both")
    if args.sim:
        from swarmtune.engine.backends.sim_backend import SimBackend
        from swarmtune.engine.model.profiles import profile

        return SimBackend(profile(args.sim))
    from swarmtune.engine.model.default_model import default_model_path
    from swarmtune.engine.model.model_facts import read_model_facts

    facts = read_model_facts(args.model or default_model_path())
    try:
        from swarmtune.engine.backends.llama_backend import LlamaBackend
    except ImportError as e:
        raise UserError(f"llama-cpp-python is not usable here ({e}); build it, or use --sim PROFILE") from None
    layers = getattr(args, "gpu_layers", None)
    return LlamaBackend(facts, n_threads=args.threads, use_extra_bufts=args.extra_bufts,
                        measure_routing=getattr(args, "moe_routing", False),
                        device_sampling=not getattr(args, "host_sampling", False),
                        n_gpu_layers=-1 if layers is None else layers, cpu_only=layers == 0)


def check_flags(args: argparse.Namespace) -> None:
    """The settings flags, checked before a model loads, in the engine's own words."""
    from swarmtune.engine.settings import (
        cap_in_force,
        check_agents,
        check_batch_cap,
        check_residency,
        check_tool_latency,
    )

    check_residency(args.residency)
    check_tool_latency(args.tool_latency, args.tool_latency_sigma)
    check_agents(args.agents)
    if args.batch_cap is not None:
        check_batch_cap(cap_in_force(args.batch_cap, args.agents), args.agents)


def engine_settings(args: argparse.Namespace, backend):
    from swarmtune.engine.settings import AUTO_DRAFT_TOKENS, EngineSettings, check_default

    prof = getattr(backend, "profile", None)
    ctx = args.ctx or (prof.context_per_agent if prof else min(2048, backend.facts.n_ctx_train or 2048))
    budget = args.kv_budget_mb * 1e6 if args.kv_budget_mb is not None else (prof.kv_budget_bytes if prof else None)
    draft, draft_model = getattr(args, "draft", (0, False)), getattr(args, "draft_model", None)
    if draft_model and not draft[0]:  # a draft model asked for: it drafts, each agent's length as measured
        draft = (AUTO_DRAFT_TOKENS, True)
    return EngineSettings(
        agents=args.agents, batch_cap=args.batch_cap or args.agents, kv=args.kv, seed=args.seed,
        gen_tokens=args.gen_tokens, tool_tokens=args.tool_tokens, ctx_per_agent=ctx, kv_budget_bytes=budget,
        reference=not args.no_reference, check=args.check or check_default(), kv_convert=not args.no_kv_convert,
        tool_latency_s=args.tool_latency, tool_latency_sigma=args.tool_latency_sigma, residency=args.residency,
        swap_limit_bytes=args.swap_limit_mb * 1e6 if args.swap_limit_mb is not None else None,
        draft_tokens=draft[0], draft_auto=draft[1], draft_model=draft_model,
        max_stall_s="auto" if (stall := getattr(args, "max_stall_ms", None)) == "auto" else
        stall / 1000 if isinstance(stall, float) else None,
        mix={"on": True, "off": False}.get(getattr(args, "mix", "auto")),
    )


def tuner_goal(args: argparse.Namespace):
    from swarmtune.engine.quality.quality_check import DEFAULT_KV_QUALITY, QUALITY_CANDIDATES
    from swarmtune.engine.tune.goal import Goal, parse_objective

    objective, floor = parse_objective(args.autotune or "tokens_per_s")
    kv = args.kv  # a KVSetting: parsing.py read it
    flag = getattr(args, "kv_quality", None)
    # a model's quality is measured live; the simulated card has no logits, so it has no quality budget
    quality = None if flag == "off" or args.sim else DEFAULT_KV_QUALITY if flag is None else float(flag)
    if args.tune_kv:
        allowed = args.tune_kv
    elif quality is not None:  # whatever the budget allows, as measured: the candidates worth their bytes
        allowed = tuple(dict.fromkeys((kv, *QUALITY_CANDIDATES)))
    else:
        allowed = (kv,)
    if kv not in allowed:
        raise UserError(f"--tune-kv {','.join(map(str, allowed))} leaves out --kv {kv}, the type the run starts at")
    if args.power_cap_w is not None and args.power_cap_w <= 0:
        raise UserError(f"--power-cap-w must be positive (got {args.power_cap_w})")
    # a run of known length plans for what is left of it (`tune` sets its default length itself)
    return Goal(objective=objective, floor_tokens_per_s=floor, allowed_kv=allowed, power_cap_watts=args.power_cap_w,
                run_s=getattr(args, "duration", None), kv_quality=quality)


def power_meter(args: argparse.Namespace, goal, profile):
    """The power source --power names, checked against what the tuner's goal needs of it."""
    from swarmtune.engine.measure.power.meter import ModeledMeter, make_meter

    meter = make_meter(args.power, profile)
    if (goal.objective == "joules_per_token" or goal.power_cap_watts) and not isinstance(meter, ModeledMeter):
        why = meter.reason if meter.label is None else f"{meter.label} measures, but cannot forecast other settings"
        raise UserError("the tuner forecasts power from a power model, which only the simulated profiles have "
                        f"(--sim); here: {why}")
    return meter


def preview(args: argparse.Namespace) -> dict:
    """The run's preview header (engine/record/run_header.py), from the model file's header and the flags, with every
    flag checked as make_engine checks it: a bad one is refused before any screen is drawn. The simulated card
    is cheap to make; a model is only read here, not loaded."""
    from types import SimpleNamespace

    from swarmtune.engine.record.run_header import preview_header

    check_flags(args)
    goal = tuner_goal(args)
    if args.sim and args.model:
        raise UserError("give --model or --sim, not both")
    if args.sim:
        backend = make_backend(args)
        facts, source, name = backend.facts, backend.source, backend.info.name
    else:
        from swarmtune.engine.model.default_model import default_model_path
        from swarmtune.engine.model.model_facts import read_model_facts

        facts, source, name = read_model_facts(args.model or default_model_path()), "measured", "llama.cpp"
        backend = SimpleNamespace(facts=facts)
    settings = engine_settings(args, backend)
    settings.validate(facts.n_ctx_train)
    power_meter(args, goal, getattr(backend, "profile", None))  # a bad --power, said before the screen
    return preview_header(facts, settings, source, name)


def make_engine(args: argparse.Namespace, progress=None):
    from swarmtune.engine.engine import Engine
    from swarmtune.engine.tune.tuner import Tuner

    check_flags(args)
    goal = tuner_goal(args)
    backend = make_backend(args)
    try:
        settings = engine_settings(args, backend)
        meter = power_meter(args, goal, getattr(backend, "profile", None))
        agents = None
        if getattr(args, "clients", False):  # the agents are the HTTP clients' conversations
            from swarmtune.engine.agents.served import ServedAgents

            agents = ServedAgents(backend, max_queue=args.max_queue, cache_reuse=args.cache_reuse)
        from swarmtune.engine.quality.quality_check import QualityCheck

        # the live quality check on a model (the simulated card has no logits): it measures the live setting
        # where it is quantized, and the settings the tuner may move to, at the swarm's own contexts
        quality = None if backend.source == "simulated" else QualityCheck(wanted=goal.allowed_kv)
        return Engine(backend, settings, progress=progress, meter=meter, tuner=Tuner(goal),
                      autotune=args.autotune is not None, agents=agents, quality=quality)
    except BaseException:
        backend.close()
        raise

"""``execstate serve``: build the engine, its thread, the app, and run uvicorn.

Start-up order (``run_server``):

1. ``--kv-transfer-config`` is parsed first (``KVTransferConfig.from_json``, then
   ``pd_config()``): a bad config fails before any model is loaded.
2. ``LLMEngine`` from the CLI flags (capacity: ``--max-num-seqs``,
   ``--max-num-batched-tokens``, ``--kv-cache-memory`` / ``--num-kv-blocks``,
   ``--max-model-len``) and the PD config (``EngineConfig.kv_transfer``: the engine builds its PD
   connector with its other KV connectors, the serving metrics' ``record_transfer`` as its
   ``on_transfer``), wrapped in an ``AsyncEngine`` whose waiting queue is bounded by
   ``--max-waiting-requests`` (its thread starts).
3. The PD connector's handoff trust policy (``AsyncEngine.handoff_trust``) goes to the app.
4. ``build_app`` with the request limits (``ServingLimits`` from the flags) and the handoff
   trust; the start-up summary is logged (``startup_log``: model, dtype, kernels, KV blocks,
   limits, PD role, ...);
   ``serve_until_engine_dies``; on exit the engine thread is shut down.
   With ``--agent-back-model``, a second engine (same flags, that model) serves the agents'
   back-end model (``/v1/realtime/agent``, ``realtime/agent/``); it is shut down with the first.

Exit status: 1 when the engine stopped serving (a crash, or a failed step that left
shared state corrupt): ``/health`` has answered 503 with the reason meanwhile, the
server stops accepting requests, and the non-zero status tells a supervisor to restart
it. Stopped by a signal, the process ends as uvicorn ends it (it re-raises the signal:
130 for SIGINT).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING

from execstate.agent.backend import TaskLimits
from execstate.engine.async_engine import AsyncEngine
from execstate.engine.config import EngineConfig
from execstate.identity.scope import PrefixSharing
from execstate.serve.kv_transfer_config import KVTransferConfig
from execstate.serve.limits import ServingLimits
from execstate.serve.metrics import ServingMetrics
from execstate.serve.principals import keys_from_args
from execstate.session.runtime.manager import SessionPolicy
from execstate.state.kv_events.config import KVEventsConfig
from execstate.state.quotas import KINDS, Quotas
from execstate.voice.engines import VoiceEngines, default_engines
from execstate.voice.vocabulary import demo_phrases

if TYPE_CHECKING:
    import uvicorn

    from execstate.engine.pd_config import ImporterFactory

logger = logging.getLogger(__name__)


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    events = getattr(args, "kv_events_config", None)
    routes = args.enable_return_routed_experts or getattr(args, "routed_experts_on_request", False)  # R3 recording
    return EngineConfig(
        model=args.model,
        dtype=args.dtype,
        device=args.device,
        block_size=args.block_size,
        enable_return_routed_experts=routes,
        seed=args.seed,
        max_model_len=args.max_model_len,
        kernels=args.kernels,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        prompt_logprobs_chunk_tokens=getattr(args, "prompt_logprobs_chunk_tokens", 512),
        kv_cache_memory_bytes=args.kv_cache_memory,
        num_kv_blocks=args.num_kv_blocks,
        prefault_kv=getattr(args, "prefault_kv", False),
        max_sessions=args.max_sessions,
        session_eviction=None if args.session_eviction == "none" else args.session_eviction,
        max_session_events=args.max_session_events,
        max_session_checkpoints=getattr(args, "max_session_checkpoints", 64),
        offload_dram_bytes=args.offload_dram,
        offload_disk_dir=args.offload_disk_dir,
        offload_disk_bytes=args.offload_disk_bytes,
        offload_redis_url=args.offload_redis_url,
        offload_redis_bytes=args.offload_redis_bytes,
        offload_policy=args.offload_policy,
        offload_timeout_s=args.offload_timeout,
        kv_events=KVEventsConfig.from_json(events) if events else None,
        chat_template=getattr(args, "chat_template", None),
    )


def quotas_from_args(args: argparse.Namespace) -> Quotas:
    return Quotas(**{kind: getattr(args, f"tenant_max_{kind}", None) for kind in KINDS})


def policy_from_args(args: argparse.Namespace) -> SessionPolicy:
    from execstate.serve.app import DEFAULT_IDLE_TTL_S, serve_policy

    return serve_policy(getattr(args, "session_idle_ttl", DEFAULT_IDLE_TTL_S),
                        getattr(args, "max_session_checkpoints", 64), quotas_from_args(args),
                        getattr(args, "session_hibernate_after", None))


def limits_from_args(args: argparse.Namespace) -> ServingLimits:
    return ServingLimits(**{f.name: getattr(args, f.name) for f in fields(ServingLimits)})


def serve_until_engine_dies(server: uvicorn.Server, async_engine: AsyncEngine) -> int:
    """Run ``server`` (a ``uvicorn.Server``) until it exits; stop it if the engine stops
    serving first. Returns the exit status: 1 if the engine died, else 0."""
    died = threading.Event()

    def watch() -> None:
        async_engine.wait_dead()
        if server.should_exit:
            return  # shutting down anyway
        died.set()
        logger.critical("the engine stopped serving (%s); shutting the server down", async_engine.error)
        server.should_exit = True

    threading.Thread(target=watch, name="execstate-engine-watch", daemon=True).start()
    server.run()
    return 1 if died.is_set() or not async_engine.is_healthy else 0


def voice_engines_from_args(args: argparse.Namespace) -> Callable[[], VoiceEngines]:
    """The voice endpoint's engines (built on first use): ``--voice-asr`` picks the recognizer,
    ``--voice-asr-phrases`` PocketSphinx's model."""
    spec = getattr(args, "voice_asr_phrases", None)
    asr = getattr(args, "voice_asr", "pocketsphinx") or "pocketsphinx"

    def build() -> VoiceEngines:
        if spec is None:
            return default_engines(asr=asr)
        if spec == "demo":
            return default_engines(demo_phrases(), asr=asr)
        lines = Path(spec).read_text(encoding="utf-8").splitlines()
        return default_engines([ln for ln in lines if ln.strip()], asr=asr)

    return build


def run_server(args: argparse.Namespace, make_importer: ImporterFactory | None = None) -> int:
    """``execstate serve`` (module docstring). ``make_importer``: the PD connector's importer
    (None: the real one; ``benchmarks/execstate_bench/faulty_serve.py`` passes a fault-injecting one)."""
    import uvicorn

    from execstate.serve.app import build_app
    from execstate.serve.landing import install_landing
    from execstate.serve.realtime.limits import MAX_FRAME_BYTES
    from execstate.serve.startup_log import StartupInfo, log_startup

    if args.model is None:  # execstate serve --world: world sessions only
        from execstate.serve.realtime.world.app import run_world_server

        return run_world_server(args)
    t0 = time.perf_counter()
    kv_cfg = KVTransferConfig.from_json(args.kv_transfer_config) if args.kv_transfer_config else None
    pd = kv_cfg.pd_config() if kv_cfg is not None else None
    limits = limits_from_args(args)
    keys, policy = keys_from_args(args), policy_from_args(args)  # bad keys or targets fail before the model loads
    sharing = PrefixSharing.parse(getattr(args, "shared_prefix_group", None) or [])
    from execstate.serve.sessions.targets import MigrationTargets

    targets = MigrationTargets.parse(getattr(args, "migration_targets", None))
    metrics = ServingMetrics()
    async_engine = AsyncEngine.from_config(dataclasses.replace(engine_config_from_args(args), kv_transfer=pd),
                                           limits.max_waiting_requests, make_importer=make_importer,
                                           on_transfer=metrics.record_transfer)
    back_engine = None
    world_host = None
    try:
        if getattr(args, "agent_back_model", None):  # the agents' back-end model: a second engine
            back_cfg = dataclasses.replace(engine_config_from_args(args), model=args.agent_back_model,
                                           chat_template=None)  # --chat-template is the served model's
            back_engine = AsyncEngine.from_config(back_cfg, limits.max_waiting_requests)
        name = args.served_model_name or str(args.model)
        app = build_app(
            async_engine,
            name,
            metrics=metrics,
            kv_transfer_config=kv_cfg,
            limits=limits,
            handoff_trust=async_engine.handoff_trust,
            realtime_grace_s=args.realtime_grace_s,
            agent_back_engine=back_engine,
            keys=keys,
            policy=policy,
            sharing=sharing,
            migration_targets=targets,
            migration_skew_s=getattr(args, "migration_skew_s", 30.0),
            agent_task_limits=TaskLimits(args.agent_tool_timeout_s, args.agent_max_tasks),
            voice_engines=voice_engines_from_args(args),
            routes_on_request=getattr(args, "routed_experts_on_request", False),
            public_metrics=getattr(args, "public_metrics", False),
        )
        if args.world is not None:  # the world endpoints on the same app (serve --world)
            from execstate.serve.realtime.world.app import world_host_from_args
            from execstate.serve.realtime.world.endpoint import install_world

            world_host = world_host_from_args(args)
            install_world(app, world_host)
        install_landing(app)  # after every surface: it lists them
        elapsed = time.perf_counter() - t0
        log_startup(StartupInfo(async_engine.summary_blocking(), args, kv_cfg, elapsed, limits, keys, policy,
                                targets.describe(), sharing))
        server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="info",
                                               ws_max_size=MAX_FRAME_BYTES))
        return serve_until_engine_dies(server, async_engine)
    finally:
        async_engine.shutdown()
        if back_engine is not None:
            back_engine.shutdown()
        if world_host is not None:
            world_host.shutdown()


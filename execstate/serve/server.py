"""``execstate serve``: build the engine, its thread, the app, and run uvicorn.

Start-up order (``run_server``):

1. ``--kv-transfer-config`` is parsed first (``KVTransferConfig.from_json``): a bad
   config fails before any model is loaded.
2. ``LLMEngine`` from the CLI flags, wrapped in an ``AsyncEngine`` (its thread starts).
3. With a kv-transfer config: ``attach_kv_connector(async_engine, kv_cfg, metrics)``,
   before the app accepts requests.
4. ``build_app`` and ``uvicorn.run``; on exit the engine thread is shut down.
"""

from __future__ import annotations

import argparse

from execstate.engine.async_engine import AsyncEngine
from execstate.engine.config import EngineConfig
from execstate.serve.kv_transfer_config import KVTransferConfig
from execstate.serve.metrics import ServingMetrics


def attach_kv_connector(
    async_engine: AsyncEngine, kv_cfg: KVTransferConfig, metrics: ServingMetrics | None = None
) -> None:
    """Install the PD connector described by ``kv_cfg`` on the engine (placeholder).

    Called once at start-up, after the engine thread started and before any request.
    Engine state must only be touched on the engine thread: use
    ``async_engine.call(fn)`` here (blocking) or ``await async_engine.run_on_engine(fn)``
    later. Report each finished transfer with ``metrics.record_transfer(num_bytes, ok)``.
    Per request, the server already passes the body's ``kv_transfer_params`` to
    ``LLMEngine.add_request`` and returns ``RequestOutput.kv_transfer_params`` top-level.
    """
    raise NotImplementedError(
        f"PD connector: {kv_cfg.kv_connector} ({kv_cfg.kv_role}) is not implemented yet "
        "(execstate.serve.server.attach_kv_connector)"
    )


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=args.model,
        dtype=args.dtype,
        device=args.device,
        block_size=args.block_size,
        enable_return_routed_experts=args.enable_return_routed_experts,
        seed=args.seed,
        max_model_len=args.max_model_len,
    )


def run_server(args: argparse.Namespace) -> int:
    import uvicorn

    from execstate.engine.llm_engine import LLMEngine
    from execstate.serve.app import build_app

    kv_cfg = KVTransferConfig.from_json(args.kv_transfer_config) if args.kv_transfer_config else None
    async_engine = AsyncEngine(LLMEngine(engine_config_from_args(args)))
    try:
        metrics = ServingMetrics()
        if kv_cfg is not None:
            attach_kv_connector(async_engine, kv_cfg, metrics)
        name = args.served_model_name or str(args.model)
        app = build_app(async_engine, name, api_key=args.api_key, metrics=metrics, kv_transfer_config=kv_cfg)
        uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    finally:
        async_engine.shutdown()
    return 0


"""``execstate serve``: build the engine, its thread, the app, and run uvicorn.

Start-up order (``run_server``):

1. ``--kv-transfer-config`` is parsed first (``KVTransferConfig.from_json``): a bad
   config fails before any model is loaded.
2. ``LLMEngine`` from the CLI flags, wrapped in an ``AsyncEngine`` (its thread starts).
3. With a kv-transfer config: ``attach_kv_connector(async_engine, kv_cfg, metrics)``,
   before the app accepts requests; its handoff trust policy goes to the app.
4. ``build_app`` and ``uvicorn.run``; on exit the engine thread is shut down.
"""

from __future__ import annotations

import argparse

from execstate.engine.async_engine import AsyncEngine
from execstate.engine.config import EngineConfig
from execstate.engine.llm_engine import LLMEngine
from execstate.serve.kv_transfer_config import KVTransferConfig
from execstate.serve.metrics import ServingMetrics
from execstate.transfer.handoff import HandoffTrust


def attach_kv_connector(
    async_engine: AsyncEngine, kv_cfg: KVTransferConfig, metrics: ServingMetrics | None = None
) -> HandoffTrust | None:
    """Install the PD connector described by ``kv_cfg`` on the engine; returns the handoff
    trust policy the HTTP layer checks incoming handoffs with (``None`` unless a consumer).

    Called once at start-up, after the engine thread started and before any request;
    the connector is built on the engine thread (``async_engine.call``). Keys read from
    ``kv_connector_extra_config`` (all optional): ``side_channel_host`` / ``side_channel_port``
    (the control channel, default 127.0.0.1 and a free port), ``max_inflight_transfers``
    (default 64: exports pinned on P, loads in flight on D), ``max_transfer_bytes``,
    ``transfer_ttl_s`` (default 60: how long P keeps an export D never released),
    ``transfer_timeout_s``, ``kv_secret`` (the handoff HMAC secret; default
    ``$EXECSTATE_KV_SECRET``), ``allowed_prefill_engines`` (engine id -> ``tcp://host:port``),
    ``max_fenced_blocks`` (default a quarter of the KV pool). Unknown extra keys are rejected.
    """
    from execstate.engine.pd_connector import PDConfig

    extra = dict(kv_cfg.kv_connector_extra_config or {})
    known = {
        "side_channel_host": "host",
        "side_channel_port": "port",
        "max_inflight_transfers": "max_inflight",
        "max_transfer_bytes": "max_bytes",
        "transfer_ttl_s": "ttl_s",
        "transfer_timeout_s": "timeout_s",
        "kv_secret": "secret",
        "allowed_prefill_engines": "allowed_prefill",
        "max_fenced_blocks": "max_fenced_blocks",
    }
    unknown = sorted(set(extra) - set(known))
    if unknown:
        raise ValueError(f"kv_connector_extra_config: unknown key(s) {unknown}; known: {sorted(known)}")
    cfg = PDConfig(
        role=kv_cfg.kv_role,
        failure_policy=kv_cfg.kv_load_failure_policy,
        routes_transfer=kv_cfg.enable_routed_experts_transfer,
        engine_id=kv_cfg.engine_id,
        **{known[k]: v for k, v in extra.items()},
    )

    def attach(engine: LLMEngine) -> HandoffTrust | None:
        connector = engine.attach_pd(cfg)
        if metrics is not None:
            connector.on_transfer = metrics.record_transfer
        return connector.trust if connector.is_consumer else None

    return async_engine.call(attach)


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=args.model,
        dtype=args.dtype,
        device=args.device,
        block_size=args.block_size,
        enable_return_routed_experts=args.enable_return_routed_experts,
        seed=args.seed,
        max_model_len=args.max_model_len,
        kernels=args.kernels,
    )


def run_server(args: argparse.Namespace) -> int:
    import uvicorn

    from execstate.serve.app import build_app

    kv_cfg = KVTransferConfig.from_json(args.kv_transfer_config) if args.kv_transfer_config else None
    async_engine = AsyncEngine(LLMEngine(engine_config_from_args(args)))
    try:
        metrics = ServingMetrics()
        trust = attach_kv_connector(async_engine, kv_cfg, metrics) if kv_cfg is not None else None
        name = args.served_model_name or str(args.model)
        app = build_app(async_engine, name, api_key=args.api_key, metrics=metrics, kv_transfer_config=kv_cfg,
                        handoff_trust=trust)
        uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    finally:
        async_engine.shutdown()
    return 0


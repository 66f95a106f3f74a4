"""The OpenAI-compatible HTTP app: ``build_app(async_engine, served_model_name, ...)``.

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (``openai/``),
``/v1/sessions...`` (``sessions/``: a minimal session API and session migration),
the ``/v1/realtime`` WebSocket (``realtime/lm/``: LM sessions), the ``/v1/realtime/agent`` WebSocket
(``realtime/agent/``: full-duplex agents), ``GET /v1/models``, ``GET /health`` (``health.py``: 200
``{"status": "ok"}``, 503 with the reason once the engine thread is dead), ``GET /metrics``
(Prometheus text, this app's registry), ``GET /openapi.json`` (the HTTP API's OpenAPI schema, as
vLLM serves it: what the schema fuzzer, tests/serve/test_schema_fuzz.py, generates requests from).
Every error is an OpenAI error body (``errors.py``).

``limits`` (``ServingLimits``) bounds every request: the body size is checked by
``BodySizeLimitMiddleware`` before parsing (413), the fields by
``openai/limit_checks.check_limits`` (400), the waiting queue by the engine's admission
control (429; its size is the ``AsyncEngine``'s ``max_waiting_requests`` argument,
which ``serve`` sets from the same limits). Unknown request fields are ignored and
named in the ``X-Ignored-Fields`` response header (comma-separated, percent-encoded, at
most ``MAX_IGNORED_LISTED``) and the log.

The app does not own the engine: whoever built the ``AsyncEngine`` shuts it down.
``app.state.ctx`` (``ServeContext``) holds the engine, the served name, the metrics
(``ctx.metrics.record_transfer`` for the PD layer) and the parsed ``--kv-transfer-config``.

Trust (docs/security.md, docs/security.md): ``keys`` (a ``KeyRing``: ``--api-key`` repeated,
``--api-keys-file``) map API keys to tenants, and every surface resolves session ids in the
caller's tenant's namespace; without keys the server is open (one local tenant). ``policy``
bounds long-lived state (idle expiry of detached sessions, checkpoints per session, per-tenant
quotas: ``serve_policy``); ``migration_targets`` is the ``--migration-targets`` allow-list. While
the app runs, a sweep expires idle sessions and uncommitted hand-overs every ``sweep_interval`` (at
most 10 s) and hands the C heap's free pages back to the OS (``heap_trim.py``: RSS comes back after a
burst).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from execstate.agent.backend import TaskLimits
from execstate.engine.async_engine import AsyncEngine, EngineDeadError
from execstate.engine.engine_facts import EngineLoad
from execstate.identity.scope import PrefixSharing
from execstate.serve.auth import APIKeyMiddleware, public_paths
from execstate.serve.body_limit import BodySizeLimitMiddleware
from execstate.serve.context import ServeContext
from execstate.serve.errors import install_error_handlers
from execstate.serve.health import health_response
from execstate.serve.heap_trim import trim_heap
from execstate.serve.kv_transfer_config import KVTransferConfig
from execstate.serve.limits import ServingLimits
from execstate.serve.metrics import ServingMetrics
from execstate.serve.openai.chat import create_chat_completion
from execstate.serve.openai.completions import create_completion
from execstate.serve.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
    SamplingRequest,
    ignored_fields,
)
from execstate.serve.openai.tokenize import install_tokenize_routes
from execstate.serve.principals import KeyRing
from execstate.serve.realtime.agent.endpoint import install_agent
from execstate.serve.realtime.lm.endpoint import DEFAULT_GRACE_S, install_realtime
from execstate.serve.realtime.voice.handlers import install_voice
from execstate.serve.sessions.handover import PEER_PATHS, IncomingHandovers
from execstate.serve.sessions.routes import install_session_routes
from execstate.serve.sessions.targets import MigrationTargets
from execstate.serve.tenant_metrics import TenantMetrics
from execstate.session.lm.async_sessions import AsyncSessions
from execstate.session.runtime.manager import DEFAULT_MAX_CHECKPOINTS, SessionPolicy
from execstate.state.quotas import Quotas
from execstate.transfer.handoff import HandoffTrust
from execstate.transfer.handover import DEFAULT_SKEW_S
from execstate.voice.engines import VoiceEngines, default_engines

STATS_TIMEOUT_S = 5.0
OPENAPI_PATH = "/openapi.json"  # the HTTP API's OpenAPI schema (as vLLM serves it); a key on a keyed server
MAX_IGNORED_LISTED = 32
IGNORED_FIELDS_HEADER = "X-Ignored-Fields"
DEFAULT_IDLE_TTL_S = 600.0
MAX_SWEEP_INTERVAL_S = 10.0
TRIM_INTERVAL_S = 10.0  # the C heap's free pages go back to the OS at most this often (heap_trim.py)


def serve_policy(idle_ttl_s: float | None = DEFAULT_IDLE_TTL_S, max_checkpoints: int = DEFAULT_MAX_CHECKPOINTS,
                 quotas: Quotas | None = None, hibernate_after_s: float | None = None) -> SessionPolicy:
    """A server's bounds on sessions: detached ones expire after ``idle_ttl_s`` (``--session-idle-ttl``),
    ``max_checkpoints`` per session (``--max-session-checkpoints``), per-tenant ``quotas``; detached
    ones hibernate after ``hibernate_after_s`` (``--session-hibernate-after``)."""
    return SessionPolicy(max_checkpoints=max_checkpoints, idle_ttl_s=idle_ttl_s, quotas=quotas or Quotas(),
                         hibernate_after_s=hibernate_after_s)

logger = logging.getLogger(__name__)


def _mark_ignored(response: Response, req: SamplingRequest) -> Response:
    names = ignored_fields(req)
    if names:
        listed = [quote(n, safe="") for n in names[:MAX_IGNORED_LISTED]]
        if len(names) > MAX_IGNORED_LISTED:
            listed.append(f"+{len(names) - MAX_IGNORED_LISTED}-more")
        response.headers[IGNORED_FIELDS_HEADER] = ",".join(listed)
        logger.info("ignored unknown request field(s): %s", ",".join(listed))
    return response


def build_app(
    async_engine: AsyncEngine,
    served_model_name: str,
    api_key: str | None = None,
    *,
    metrics: ServingMetrics | None = None,
    kv_transfer_config: KVTransferConfig | None = None,
    limits: ServingLimits | None = None,
    handoff_trust: HandoffTrust | None = None,
    realtime_grace_s: float = DEFAULT_GRACE_S,
    agent_back_engine: AsyncEngine | None = None,
    sessions: AsyncSessions | None = None,
    keys: KeyRing | None = None,
    policy: SessionPolicy | None = None,
    sharing: PrefixSharing | None = None,
    migration_targets: MigrationTargets | list[str] | None = None,
    migration_skew_s: float = DEFAULT_SKEW_S,
    agent_task_limits: TaskLimits | None = None,
    voice_engines: Callable[[], VoiceEngines] | None = None,
    routes_on_request: bool = False,
    public_metrics: bool = False,
) -> FastAPI:
    """An app serving ``async_engine`` under ``served_model_name`` (the only accepted
    ``model``). ``api_key`` guards every path but the public ones (``auth.py``); ``metrics``
    defaults to a fresh registry, ``limits`` to ``ServingLimits()``; ``handoff_trust`` (PD decode side) decides which
    handoff parameters are accepted; ``realtime_grace_s`` how long a session of a dropped
    ``/v1/realtime`` connection is kept for ``session.resume`` (``realtime/lm/owners.py``);
    ``agent_back_engine`` serves the back-end model of ``/v1/realtime/agent`` agents (``realtime/agent/``;
    default: ``async_engine`` at batch priority); ``sessions``: the engine's ``AsyncSessions`` when
    another app already serves sessions on ``async_engine`` (an engine has one), else a new one.
    ``keys`` (or ``api_key``: one key, tenant ``default``), ``policy`` (default ``serve_policy()``),
    ``sharing`` (the operator's shared prefix groups; default: each tenant's cache is its own; a
    shared ``sessions`` must have been built with the same) and ``migration_targets``: the module
    docstring's trust settings; ``migration_skew_s``: the clock
    skew allowed between instances (a hand-over's nonce is remembered this long past its expiry,
    and a source resumes an unconfirmed hand-over only this long after it); ``agent_task_limits``:
    each agent's back-end bounds (tool timeout, tasks at once); ``voice_engines`` builds the audio
    engines of ``/v1/voice/realtime`` (``voice/engines.py``; default: eSpeak NG, Silero VAD,
    PocketSphinx), on first use. ``routes_on_request``: a completion returns its routes only when it asks
    (``return_routed_experts: true``), not by default (``ServeContext.wants_routes``); ``public_metrics``:
    ``/metrics`` answers without a key on a keyed server (``--public-metrics``; every other path but
    ``/health`` and the browser pages needs one: ``auth.py``)."""
    limits = limits or ServingLimits()
    keys = keys if keys is not None else KeyRing.build([api_key] if api_key else [])
    policy = policy or serve_policy()
    targets = migration_targets if isinstance(migration_targets, MigrationTargets) else \
        MigrationTargets.parse(migration_targets)
    ctx = ServeContext(async_engine, served_model_name, metrics or ServingMetrics(), kv_transfer_config, limits,
                       handoff_trust=handoff_trust, shared_sessions=sessions, policy=policy,
                       sharing=sharing or PrefixSharing(), routes_by_default=not routes_on_request)
    tenant_metrics = TenantMetrics(ctx.metrics.registry, policy.quotas)
    swept: list[IncomingHandovers] = []
    app = FastAPI(title="execstate", docs_url=None, redoc_url=None, openapi_url=OPENAPI_PATH,
                  lifespan=lambda app: _sweeping(ctx, swept, policy))
    app.state.ctx = ctx
    app.state.keys = keys
    public = public_paths(app)  # /health; the pages add theirs as they are installed
    if public_metrics:
        public.add("/metrics")
    install_error_handlers(app)
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=limits.max_request_bytes)
    # added last: runs first, so an unauthenticated body is never read; it names every caller's tenant
    app.add_middleware(APIKeyMiddleware, keys=keys, peer_paths=PEER_PATHS, public=public)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return _mark_ignored(await create_completion(ctx, body, request), body)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return _mark_ignored(await create_chat_completion(ctx, body, request), body)

    install_tokenize_routes(app, ctx)  # /tokenize, /detokenize, /version (vLLM's)
    install_realtime(app, ctx, realtime_grace_s)
    agent = install_agent(app, ctx, agent_back_engine, agent_task_limits)  # /v1/realtime/agent: full-duplex agents
    # /v1/voice/realtime + /agent: the same agents over audio (OpenAI Realtime's audio protocol),
    # with the agent endpoint's tools; the audio engines are built on first use
    install_voice(app, ctx, lambda: agent.tools.tools, voice_engines or default_engines, agent.task_limits)

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        card = ModelCard(
            id=served_model_name, root=str(async_engine.model_path), max_model_len=async_engine.max_model_len
        )
        return JSONResponse(ModelList(data=[card]).model_dump())

    @app.get("/health")
    async def health() -> JSONResponse:
        return health_response(None if async_engine.is_healthy else str(async_engine.error))

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        stats: EngineLoad | None = None
        if async_engine.is_healthy:
            try:
                stats = await asyncio.wait_for(async_engine.load(), STATS_TIMEOUT_S)
            except (EngineDeadError, TimeoutError):
                stats = None
        ctx.metrics.set_engine_stats(stats, async_engine.is_healthy)
        await _tenant_usage(app, ctx, tenant_metrics)
        return Response(ctx.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    # /v1/sessions...: minimal session API, migration (sending) and hand-overs (receiving)
    app.state.migrations, incoming = install_session_routes(app, ctx, targets, migration_skew_s)
    swept.append(incoming)
    return app


async def _tenant_usage(app: FastAPI, ctx: ServeContext, tenant_metrics: TenantMetrics) -> None:
    """Per-tenant gauges from the LM sessions (engine thread) and the world sessions, if served."""
    usage: dict[str, dict[str, int]] = {}
    expired = None
    if ctx.engine.is_healthy:
        with contextlib.suppress(EngineDeadError, TimeoutError):
            lm, expired = await asyncio.wait_for(ctx.sessions.usage(), STATS_TIMEOUT_S)
            usage = {t: dict(c) for t, c in lm.items()}
    world = getattr(app.state, "world", None)
    if world is not None:
        for tenant, n in world.host.usage().items():
            usage.setdefault(tenant, {})["world_sessions"] = n
    tenant_metrics.set(usage, expired)


@contextlib.asynccontextmanager
async def _sweeping(ctx: ServeContext, swept: list[IncomingHandovers], policy: SessionPolicy) -> AsyncIterator[None]:
    """While the app runs: expire idle detached sessions and uncommitted hand-overs periodically."""
    ttl = policy.idle_ttl_s
    shortest = min((t for t in (ttl, policy.hibernate_after_s) if t is not None), default=None)
    interval = MAX_SWEEP_INTERVAL_S if shortest is None else max(0.05, min(shortest / 4, MAX_SWEEP_INTERVAL_S))

    async def sweep() -> None:
        trimmed = time.monotonic()
        while True:
            await asyncio.sleep(interval)
            try:
                if ctx.engine.is_healthy and policy.hibernate_after_s is not None:
                    slept = await ctx.sessions.hibernate_idle()
                    if slept:
                        logger.info("hibernated %d idle detached session(s) (--session-hibernate-after %g s)", slept,
                                    policy.hibernate_after_s)
                if ctx.engine.is_healthy:
                    gone = await ctx.sessions.expire_idle()
                    if gone:
                        logger.info("expired %d idle detached session(s) (--session-idle-ttl %g s)", len(gone), ttl)
                for incoming in swept:
                    await incoming.sweep()
                if time.monotonic() - trimmed >= TRIM_INTERVAL_S:  # what a burst freed goes back to the OS
                    await asyncio.to_thread(trim_heap)
                    trimmed = time.monotonic()
            except EngineDeadError:
                return
            except Exception:  # a sweep must never stop the server; the next one tries again
                logger.exception("the periodic sweep of idle sessions failed")

    task = asyncio.create_task(sweep(), name="execstate-sweep")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

"""A minimal HTTP API for LM sessions, and session migration between servers.

The realtime WebSocket (``/v1/realtime``) is the full session API; these endpoints cover what a
client needs without it, and the migration (``migration.py``):

- ``POST /v1/sessions`` ``{"session_id"?, "sampling"?: {SamplingParams fields}, "priority"?,
  "cache_salt"?}`` -> the session's info (``SessionInfo`` fields);
- ``GET /v1/sessions/{id}`` -> its info plus ``token_ids`` (and ``routed_experts``, base64 of a
  ``.npy``, with ``?routes=true``);
- ``POST /v1/sessions/{id}/events`` ``{"event_id", "kind", "data"}`` -> the acknowledgement;
- ``POST /v1/sessions/{id}/step`` ``{"input"?: [ids] | "text", "messages"?: [{"role", "content"}, ...],
  "max_tokens"?, "return_routes"?}`` (``messages``: a chat turn, the model's template applied one
  turn at a time: ``session/lm/chat.py``)
  -> the ``StepResult`` (``routed_experts``: base64 ``.npy`` of the step's rows when asked);
- ``DELETE /v1/sessions/{id}`` -> ``{"closed": true}``;
- ``POST /v1/sessions/{id}/hibernate``, ``.../wake``, ``GET /v1/hibernation``: ``hibernation.py``;
- ``POST /v1/sessions/{id}/migrate``: see ``migration.py``; ``POST /v1/sessions/import`` and
  its ``/commit``, ``/abort``, ``/identify``: the receiving side, ``handover.py``.

Errors are OpenAI-style bodies whose ``code`` is the session error's code (``serve/errors.py``'s
``STATUS`` gives the HTTP status of each). The API key applies (``/v1``), except on the signed
server-to-server paths.

Ownership (docs/security.md): every request asks as its API key's tenant (``serve/auth.py``), through
one scoped view of the sessions built per request (:func:`install_session_routes`' ``scoped``):
ids resolve in the tenant's namespace of the session API's realm, so another tenant's session,
an agent's front and a world session are ``not_found`` (404), and a session held by a live
``/v1/realtime`` connection is ``session_in_use`` (409), reads included. Sessions opened here are
detached: they expire after ``--session-idle-ttl`` without a call (``expired``, 410 after that).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from execstate.engine.async_engine import EngineDeadError
from execstate.engine.priority import PRIORITY_INTERACTIVE
from execstate.engine.sampling_params import SamplingParams
from execstate.serve.auth import scope_tenant
from execstate.serve.context import ServeContext, engine_dead
from execstate.serve.errors import OpenAIError, http_error
from execstate.serve.route_rows import encode_routes
from execstate.serve.sessions.handover import IncomingHandovers, install_handover_routes
from execstate.serve.sessions.hibernation import install_hibernation_routes
from execstate.serve.sessions.migration import Migrations, install_migration_routes
from execstate.serve.sessions.targets import MigrationTargets
from execstate.session.lm.async_sessions import AsyncSessions
from execstate.session.lm.chat import ChatTurn
from execstate.session.lm.events import SAMPLING_FIELDS
from execstate.session.lm.step import StepResult
from execstate.session.runtime.access import SESSIONS, Access, Owner
from execstate.session.runtime.events import SessionEventError
from execstate.transfer.handover import DEFAULT_SKEW_S, HandoverLedger


class OpenBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    session_id: str | None = None
    sampling: dict[str, Any] | None = None
    priority: int = PRIORITY_INTERACTIVE
    cache_salt: str | None = None


class StepBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    input: list[int] | str | None = None
    messages: list[dict[str, Any]] | None = None  # a chat turn (session/lm/chat.py), instead of input
    max_tokens: int | None = None
    return_routes: bool = False


class EventBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    event_id: int
    kind: str
    data: Any = None


def sampling_from_json(fields: dict[str, Any] | None) -> SamplingParams:
    """``SamplingParams`` from a JSON object (``logit_bias`` keys may be strings); 400 when bad."""
    fields = dict(fields or {})
    unknown = sorted(set(fields) - SAMPLING_FIELDS - {"seed"})
    if unknown:
        raise OpenAIError(400, f"unknown sampling field(s) {unknown}", param="sampling")
    bias = fields.get("logit_bias")
    try:
        if isinstance(bias, dict):
            fields["logit_bias"] = {int(k): v for k, v in bias.items()}
        return SamplingParams(**fields)
    except (ValueError, TypeError) as e:
        raise OpenAIError(400, str(e), param="sampling") from None


def step_json(r: StepResult, routes: bool) -> dict[str, Any]:
    out = {k: v for k, v in asdict(r).items() if k not in ("routed_experts", "logprobs")}
    if routes and r.routed_experts is not None:
        out["routed_experts"] = encode_routes(r.routed_experts)
    return out


def http_access(request: Request) -> Access:
    """How an HTTP request asks: its tenant, the session API's realm, no live connection."""
    return Access(Owner(scope_tenant(request.scope), SESSIONS))


def install_session_routes(app: FastAPI, ctx: ServeContext, targets: MigrationTargets | None = None,
                           skew_s: float = DEFAULT_SKEW_S) -> tuple[Migrations, IncomingHandovers]:
    """Add the session endpoints, the migration's and the hand-over's to ``app``; returns the
    sending side (``migration.py``) and the receiving side (``handover.py``)."""
    app.state.sessions = ctx.sessions

    def scoped(request: Request) -> AsyncSessions:
        return ctx.sessions.scoped(http_access(request))

    async def call(coro: Any) -> Any:
        ctx.check_healthy()
        try:
            return await coro
        except SessionEventError as e:
            raise http_error(e) from None
        except EngineDeadError as e:
            raise engine_dead(e) from None

    @app.post("/v1/sessions")
    async def open_session(body: OpenBody, request: Request) -> JSONResponse:
        params = sampling_from_json(body.sampling)
        info = await call(scoped(request).open(body.session_id, params, body.priority, body.cache_salt))
        return JSONResponse(asdict(info))

    @app.get("/v1/sessions/{session_id}")
    async def get_session(session_id: str, request: Request, routes: bool = False) -> JSONResponse:
        sessions = scoped(request)
        out = asdict(await call(sessions.info(session_id)))
        out["token_ids"] = await call(sessions.token_ids(session_id))
        if routes:
            out["routed_experts"] = encode_routes(await call(sessions.routed_experts(session_id)))
        return JSONResponse(out)

    @app.post("/v1/sessions/{session_id}/events")
    async def submit_event(session_id: str, body: EventBody, request: Request) -> JSONResponse:
        ack = await call(scoped(request).submit_event(session_id, body.event_id, body.kind, body.data))
        return JSONResponse({"event_id": ack.event_id, "kind": ack.kind, "status": ack.status,
                             "duplicate": ack.duplicate})

    @app.post("/v1/sessions/{session_id}/step")
    async def step(session_id: str, body: StepBody, request: Request) -> JSONResponse:
        sessions = scoped(request)
        if body.messages is not None and body.input is not None:
            raise OpenAIError(400, "give input or messages, not both", param="messages")
        value = ChatTurn(body.messages) if body.messages is not None else body.input

        async def run() -> StepResult:
            last = None
            async for item in sessions.step(session_id, value, body.max_tokens):
                last = item
            assert isinstance(last, StepResult)
            return last

        return JSONResponse(step_json(await call(run()), body.return_routes))

    @app.delete("/v1/sessions/{session_id}")
    async def close(session_id: str, request: Request) -> JSONResponse:
        await call(scoped(request).close(session_id))
        return JSONResponse({"closed": True, "session_id": session_id})

    install_hibernation_routes(app, ctx, call, scoped)
    incoming = IncomingHandovers(ctx.sessions, HandoverLedger(remember_s=skew_s))
    install_handover_routes(app, ctx, call, incoming)
    return install_migration_routes(app, ctx, call, targets or MigrationTargets(), scoped, skew_s), incoming

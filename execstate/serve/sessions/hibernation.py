"""Session hibernation over HTTP (``session/lm/hibernation.py``; docs/offload.md "Hibernation").

- ``POST /v1/sessions/{id}/hibernate`` ``{"target_engine_id"?: str, "ttl_s"?: float}`` -> the
  session's info (status ``hibernated``), this engine's id and, when its manifest is in the shared
  tier, ``manifest_key``; with ``target_engine_id``, also ``reference``: base64 of a signed
  reference (bound to that engine, a nonce, the tenant, ``ttl_s`` seconds, default 300) that the
  target's ``POST /v1/sessions/import`` takes as ``{"reference": ...}`` to wake the session there
  (``handover.py``; the first engine to claim it serves it, this one then answers ``closed``).
- ``POST /v1/sessions/{id}/wake`` -> its info (status ``open``). Any other call wakes it too.
- ``GET /v1/hibernation`` -> ``{"engine_id", "shared_tier"}``: the id a reference for this engine
  names, and whether it has a shared tier to wake sessions from.

Ownership as everywhere in the session API (``routes.py``): the caller's tenant; another tenant's
session is ``not_found``. A session held by a live connection is ``session_in_use``.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from execstate.serve.context import ServeContext
from execstate.session.lm.async_sessions import AsyncSessions
from execstate.session.lm.hibernation import REFERENCE_TTL_S, Hibernated


class HibernateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    target_engine_id: str | None = None
    ttl_s: float = REFERENCE_TTL_S


def install_hibernation_routes(app: FastAPI, ctx: ServeContext, call: Callable[[Awaitable[Any]], Awaitable[Any]],
                               scoped: Callable[[Request], AsyncSessions]) -> None:
    engine = ctx.engine

    async def where() -> dict[str, Any]:
        home = await engine.home()
        return {"engine_id": home.engine_id, "shared_tier": home.shared_tier}

    @app.get("/v1/hibernation")
    async def hibernation() -> JSONResponse:
        return JSONResponse(await call(where()))

    @app.post("/v1/sessions/{session_id}/hibernate")
    async def hibernate(session_id: str, request: Request, body: HibernateBody | None = None) -> JSONResponse:
        sessions = scoped(request)
        out = asdict(await call(sessions.hibernate(session_id)))
        a = sessions.access
        record: Hibernated = await call(sessions.run(lambda s: s.manager.get(session_id, a, wake=False).hibernation))
        out.update(await call(where()))
        out["manifest_key"] = record.manifest_key if record is not None and record.published else None
        out["hibernated_bytes"] = record.nbytes if record is not None else 0
        if body is not None and body.target_engine_id is not None:
            ref = await call(sessions.reference(session_id, body.target_engine_id, body.ttl_s))
            out["reference"] = base64.b64encode(ref).decode()
        return JSONResponse(out)

    @app.post("/v1/sessions/{session_id}/wake")
    async def wake(session_id: str, request: Request) -> JSONResponse:
        return JSONResponse(asdict(await call(scoped(request).wake(session_id))))

"""Session migration between two servers (issue 8; protocol: ``session/migration_*.py``).

``POST /v1/sessions/{id}/migrate`` ``{"target": "http://host:port", "target_api_key"?: str,
"timeout_s"?: float}`` on the *source*: on its engine thread the session is frozen (MIGRATING),
its full KV blocks are exported (PD exporter: pinned, checksummed, with route records) and its
control state is encoded and signed; the source then POSTs that offer to the target's
``/v1/sessions/import`` (with ``target_api_key``, default the source's own API key). The target
checks it, loads the KV from the source's exporter (ZeroMQ manifest + NIXL read, verified) on its
transfer thread and creates the session under the same id; its answer is the confirmation. Then
the source closes its session (200: ``{"status": "migrated", "target", "session_id",
"num_tokens", "blocks_transferred", "blocks_from_cache", "blocks_recomputed", "tokens_recomputed",
"kv_bytes", "target_seconds", "seconds", "checkpoints_dropped"}``), or, on any failure, serves it
again and answers the error (``code``: the target's code, ``unreachable``, ``timeout``, ...;
status as ``errors.STATUS``; the message says the session is still served here). The
client then talks to the target with the same session id.

The migration runs in its own task: a client that disconnects does not cut it short (the
source's session would otherwise end up on both instances or neither).

``POST /v1/sessions/import`` (``application/msgpack``: the signed offer) on the *target*: answers
200 with the import result once the session exists, or the error with nothing kept. It waits at
most until the offer's commit deadline, then abandons the import (closing the session if it was
created meanwhile), so a source that gave up never leaves a copy behind. The body is bounded by
``--max-request-bytes`` (the offer carries 2 bytes x ``n_moe_layers`` x ``top_k`` of route rows per
context token). Only a signed offer (the PD handoff secret) or one from an allow-listed engine is
accepted, besides the API key.

Trust: any client holding the source's API key can make it POST a session offer to a URL of its
choice (only ``http(s)://host[:port]``, only to the fixed import path).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from execstate.serve.context import ServeContext
from execstate.serve.errors import OpenAIError
from execstate.serve.sessions.errors import http_status
from execstate.session.lm.async_sessions import AsyncSessions
from execstate.session.lm.migration_source import Outgoing, begin_export, finish_export
from execstate.session.lm.migration_target import ImportHandle, MigrationResult, begin_import
from execstate.session.lm.migration_wire import MigrationError, decode_offer

IMPORT_PATH = "/v1/sessions/import"
MAX_WINDOW_S = 600.0
_GRACE_S = 10.0  # beyond the commit deadline, how long the source waits for the target's answer


class MigrateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    target: str
    target_api_key: str | None = None
    timeout_s: float = 30.0


def target_base(url: str) -> str:
    """``scheme://host[:port]`` of a target URL; 400 for anything else."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path.strip("/") or parts.query:
        raise OpenAIError(400, f"target must be 'http(s)://host:port', got {url!r}", param="target")
    try:
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        raise OpenAIError(400, f"target has a bad port: {url!r}", param="target") from None
    return f"{parts.scheme}://{parts.netloc}"


def result_json(r: MigrationResult) -> dict[str, Any]:
    return {"session_id": r.session_id, "num_tokens": r.num_tokens, "blocks_transferred": r.blocks_transferred,
            "blocks_from_cache": r.blocks_from_cache, "blocks_recomputed": r.blocks_recomputed,
            "tokens_recomputed": r.tokens_recomputed, "kv_bytes": r.kv_bytes, "control_bytes": r.control_bytes,
            "load_error": r.load_error, "target_seconds": r.seconds}


def install_migration_routes(app: FastAPI, ctx: ServeContext, call: Callable[[Awaitable[Any]], Awaitable[Any]],
                             api_key: str | None) -> None:
    engine, sessions = ctx.engine, ctx.sessions

    @app.post("/v1/sessions/{session_id}/migrate")
    async def migrate(session_id: str, body: MigrateBody) -> JSONResponse:
        base = target_base(body.target)
        if not 0 < body.timeout_s <= MAX_WINDOW_S:
            raise OpenAIError(400, f"timeout_s must be in (0, {MAX_WINDOW_S}]", param="timeout_s")
        out: Outgoing = await call(sessions.run(lambda s: begin_export(s, session_id, body.timeout_s)))
        key = body.target_api_key or api_key
        task = asyncio.ensure_future(_send(sessions, out, base, key))
        try:
            answer = await asyncio.shield(task)
        except MigrationError as e:
            err = OpenAIError(_LOCAL.get(e.code, 502), f"migration to {base} failed "
                              f"({e.message}); session {session_id!r} is still served here", code=e.code)
            raise err from None
        answer.update(status="migrated", target=base, seconds=time.monotonic() - out.started,
                      checkpoints_dropped=out.checkpoints_left)
        return JSONResponse(answer)

    @app.post(IMPORT_PATH)
    async def import_session(request: Request) -> JSONResponse:
        data = await request.body()
        pd = await call(engine.run_on_engine(lambda e: e.pd))  # its secret is immutable once attached
        if pd is None:
            data_or_decoded: bytes | tuple[Any, bool] = data  # begin_import refuses: no connector
        else:
            try:  # decoded and its signature checked in a worker, off the engine thread and the event loop
                data_or_decoded = await ctx.in_worker(decode_offer, data, pd.secret)
            except MigrationError as e:
                raise OpenAIError(http_status(e.code), e.message, code=e.code) from None
        handle: ImportHandle = await call(sessions.run(lambda s: begin_import(s, data_or_decoded)))
        fut = asyncio.wrap_future(handle.future)
        try:
            result = await asyncio.wait_for(asyncio.shield(fut), max(0.0, handle.offer.commit_by - time.time()))
        except TimeoutError:  # the source gives up now: never keep a copy (abandon undoes a late creation)
            await engine.run_on_engine(lambda e: handle.abandon("the commit deadline passed on the target"))
            raise OpenAIError(504, "the session could not be imported before the offer's commit deadline",
                              code="timeout") from None
        except MigrationError as e:
            raise OpenAIError(http_status(e.code), e.message, code=e.code) from None
        return JSONResponse(result_json(result))


_LOCAL = {"timeout": 504, "unsupported": 501, "unreachable": 502}


async def _send(sessions: AsyncSessions, out: Outgoing, base: str, api_key: str | None) -> dict[str, Any]:
    """POST the offer to the target, then close (confirmed) or reopen (anything else) the source
    session; the target's answer, or ``MigrationError``."""
    ok = False
    try:
        headers = {"content-type": "application/msgpack"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        timeout = max(1.0, out.commit_by - time.time()) + _GRACE_S
        try:
            async with httpx.AsyncClient(timeout=timeout) as client:
                resp = await client.post(base + IMPORT_PATH, content=out.payload, headers=headers)
        except httpx.TimeoutException:
            raise MigrationError("timeout", f"no answer from {base} within {timeout:.0f} s") from None
        except httpx.HTTPError as e:
            raise MigrationError("unreachable", f"{type(e).__name__}: {e}") from None
        if resp.status_code != 200:
            code, message = _error_of(resp)
            raise MigrationError(code, f"the target refused ({resp.status_code}): {message}")
        try:
            answer = resp.json()
        except ValueError:
            raise MigrationError("refused", "the target's answer is not JSON") from None
        if not isinstance(answer, dict) or answer.get("session_id") != out.session_id:
            raise MigrationError("refused", f"the target answered for another session: {str(answer)[:200]}")
        ok = True
        return answer
    finally:
        await sessions.run(lambda s: finish_export(s, out, ok))


def _error_of(resp: httpx.Response) -> tuple[str, str]:
    try:
        err = resp.json()["error"]
        return str(err.get("code") or "refused"), str(err.get("message") or "")[:500]
    except (ValueError, KeyError, TypeError, AttributeError):
        return "refused", resp.text[:200]

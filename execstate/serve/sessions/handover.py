"""The receiving side of a session hand-over over HTTP: import, commit, abort (docs/security.md).

**Invariant: at most one server serves a session at any time.** The target's half of it:

- ``POST /v1/sessions/import`` (the signed offer, ``session/lm/migration_wire.py``): the offer must
  be signed with the shared secret (no allow-list stands in for a signature), be for this engine
  (``wrong_target``), carry a nonce this server has not seen (``replay``) and not be expired
  (``expired``). The nonce is then remembered (a :class:`HandoverLedger`, ``transfer/handover.py``)
  until the offer's expiry plus a skew margin. The session is imported under the offer's tenant
  **without being served** (MIGRATING: every call refused ``busy``) and the answer, signed, is the
  acknowledgement. A refused or failed import keeps nothing and its nonce is dead.
- ``POST /v1/sessions/import/commit`` (signed): the source has closed its copy; the session is
  served here from now on. Refused once the hand-over was aborted or expired.
- ``POST /v1/sessions/import/abort`` (signed): the source did not get the acknowledgement; the
  imported session is dropped (or, if the offer never arrived, its nonce recorded as aborted, so
  the offer is refused if it comes late). Refused (``committed``) once committed: then this
  server serves the session and the source must not.
- An import never committed by its offer's expiry is dropped (the periodic :meth:`sweep`, and
  every call): the source, without a commit confirmed, resumes only after a confirmed abort or
  after that expiry plus the skew margin, by which time this copy is gone.
- ``POST /v1/sessions/import`` with a JSON body ``{"reference": base64}``: wake a session another
  engine hibernated into the shared tier (``session/lm/hibernation_import.py``: a signed
  reference for this engine, its nonce admitted to the same ledger; the atomic claim in the shared
  tier is the hand-over, so no commit follows). 200: the session's info.
- ``POST /v1/sessions/import/identify`` (signed): this engine's id, for a source that lists this
  server by URL only (``targets.py``).

Together with the source's half (``migration.py``: it closes its copy only on a verified
acknowledgement, and commits after that) a session is served by the source until it froze it
for the offer, then by nobody until the commit, then by the target; or, on any failure, by the
source again, and never by the target.

None of these paths takes a bearer key (``serve/auth.py``'s peer paths): their bodies are signed.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from execstate.engine.engine_facts import PeerCredentials
from execstate.identity.secret_ring import SecretRing
from execstate.serve.context import ServeContext
from execstate.serve.errors import OpenAIError, http_error
from execstate.serve.sessions.handover_wire import IMPORTED, answer_signature, open_request
from execstate.session.lm.async_sessions import AsyncSessions
from execstate.session.lm.hibernation_import import wake_from_reference
from execstate.session.lm.migration_target import ImportHandle, MigrationResult, begin_import
from execstate.session.lm.migration_wire import SessionOffer, decode_offer
from execstate.session.runtime.migration import MigrationError
from execstate.transfer.handover import HandoverError, HandoverLedger

IMPORT_PATH = "/v1/sessions/import"
COMMIT_PATH = "/v1/sessions/import/commit"
ABORT_PATH = "/v1/sessions/import/abort"
IDENTIFY_PATH = "/v1/sessions/import/identify"
PEER_PATHS = (IMPORT_PATH, COMMIT_PATH, ABORT_PATH, IDENTIFY_PATH)


def result_json(r: MigrationResult) -> dict[str, Any]:
    return {"session_id": r.session_id, "num_tokens": r.num_tokens, "blocks_transferred": r.blocks_transferred,
            "blocks_from_cache": r.blocks_from_cache, "blocks_recomputed": r.blocks_recomputed,
            "tokens_recomputed": r.tokens_recomputed, "kv_bytes": r.kv_bytes, "control_bytes": r.control_bytes,
            "load_error": r.load_error, "target_seconds": r.seconds}


class IncomingHandovers:
    """This server's hand-overs in (event loop only): the nonce ledger and the imports not yet
    committed (by nonce). Dropping an import runs ``ImportHandle.abandon`` on the engine thread
    (``AsyncSessions.abandon_import``)."""

    def __init__(self, sessions: AsyncSessions, ledger: HandoverLedger | None = None) -> None:
        self.sessions = sessions
        self.ledger = ledger or HandoverLedger()
        self.pending: dict[str, ImportHandle] = {}

    async def drop(self, handle: ImportHandle, why: str) -> None:
        await self.sessions.abandon_import(handle, why)

    async def sweep(self) -> None:
        """Drop the imports whose offers expired uncommitted."""
        await self._dropped(self.ledger.expire())

    async def admit(self, offer: SessionOffer) -> None:
        await self._dropped(self.ledger.admit(offer.nonce, offer.commit_by))

    async def _dropped(self, nonces: list[str]) -> None:
        for nonce in nonces:
            handle = self.pending.pop(nonce, None)
            if handle is not None:
                await self.drop(handle, "the hand-over expired before its commit")


def install_handover_routes(app: FastAPI, ctx: ServeContext, call: Callable[[Awaitable[Any]], Awaitable[Any]],
                            incoming: IncomingHandovers) -> None:
    engine, sessions = ctx.engine, ctx.sessions

    async def peer() -> tuple[SecretRing, str]:
        pd: PeerCredentials | None = await call(engine.peer())  # fixed when the engine was built
        if pd is None:
            raise OpenAIError(400, "this instance cannot receive sessions: it needs a PD connector "
                              "(--kv-transfer-config, role kv_consumer or kv_both)", code="unsupported")
        if pd.secrets is None:
            raise OpenAIError(403, "this instance has no shared secret (kv_secret / EXECSTATE_KV_SECRET): it "
                              "accepts no session", code="unauthorized")
        return pd.secrets, pd.instance_id

    async def request_of(name: str, request: Request) -> tuple[Any, SecretRing]:
        ring, engine_id = await peer()
        try:
            req = open_request(name, await request.body(), ring)
        except MigrationError as e:
            raise http_error(e) from None
        if req.target_engine_id not in ("", engine_id) or (name != "identify" and not req.target_engine_id):
            raise OpenAIError(403, f"the {name} is for engine {req.target_engine_id!r}, not this one",
                              code="wrong_target")
        return req, ring

    @app.post(IDENTIFY_PATH)
    async def identify(request: Request) -> JSONResponse:
        req, ring = await request_of("identify", request)
        _, engine_id = await peer()
        return JSONResponse({"engine_id": engine_id, "nonce": req.nonce,
                             "signature": answer_signature(ring, "identify", req.nonce, engine_id)})

    @app.post(IMPORT_PATH)
    async def import_session(request: Request) -> JSONResponse:
        if request.headers.get("content-type", "").startswith("application/json"):
            return await import_reference(request)
        ring, engine_id = await peer()
        data = await request.body()
        try:  # decoded and its signature checked in a worker, off the engine thread and the event loop
            offer, signed = await ctx.in_worker(decode_offer, data, ring)
        except MigrationError as e:
            raise http_error(e) from None
        if offer.target_engine_id != engine_id:
            raise OpenAIError(403, f"the offer is for engine {offer.target_engine_id!r}, not this one",
                              code="wrong_target")
        try:
            await incoming.admit(offer)
        except HandoverError as e:
            raise http_error(e) from None
        try:
            handle: ImportHandle = await call(sessions.run(lambda s: begin_import(s, (offer, signed))))
        except BaseException:
            incoming.ledger.abort(offer.nonce)
            raise
        try:
            result = await _wait(handle, sessions)
        except BaseException:
            incoming.ledger.abort(offer.nonce)
            await incoming.drop(handle, "the import failed")
            raise
        try:
            incoming.ledger.imported(offer.nonce)
        except HandoverError as e:  # aborted (or expired) meanwhile: drop it
            await incoming.drop(handle, "the hand-over was aborted during the import")
            raise http_error(e) from None
        incoming.pending[offer.nonce] = handle
        out = result_json(result)
        out.update(state=IMPORTED, nonce=offer.nonce,
                   signature=answer_signature(ring, "offer", offer.nonce, f"{IMPORTED}:{offer.session_id}"))
        return JSONResponse(out)

    async def import_reference(request: Request) -> JSONResponse:
        try:
            body = await request.json()
            ref = base64.b64decode(body["reference"], validate=True)
        except (ValueError, KeyError, TypeError, binascii.Error):
            raise OpenAIError(400, "the body is {\"reference\": base64 of a hibernation reference}",
                              code="invalid") from None
        try:
            rt = await call(sessions.run(lambda s: wake_from_reference(s, ref, incoming.ledger)))
        except MigrationError as e:
            raise http_error(e) from None
        info = await call(sessions.run(lambda s: s.describe(rt)))
        return JSONResponse(dict(asdict(info), woken=True))

    @app.post(COMMIT_PATH)
    async def commit(request: Request) -> JSONResponse:
        req, ring = await request_of("commit", request)
        try:
            incoming.ledger.commit(req.nonce)
        except HandoverError as e:
            raise http_error(e) from None
        handle = incoming.pending.pop(req.nonce, None)
        if handle is not None:
            try:
                await sessions.commit_import(handle)
            except MigrationError as e:
                raise http_error(e) from None
        return JSONResponse({"committed": True, "nonce": req.nonce,
                             "signature": answer_signature(ring, "commit", req.nonce, "committed")})

    @app.post(ABORT_PATH)
    async def abort(request: Request) -> JSONResponse:
        req, ring = await request_of("abort", request)
        try:
            had = incoming.ledger.abort(req.nonce, req.expires_at)
        except HandoverError as e:
            raise http_error(e) from None
        handle = incoming.pending.pop(req.nonce, None)
        if handle is not None:
            await incoming.drop(handle, "the source aborted the hand-over")
        return JSONResponse({"aborted": True, "had_import": had, "nonce": req.nonce,
                             "signature": answer_signature(ring, "abort", req.nonce, "aborted")})


async def _wait(handle: ImportHandle, sessions: AsyncSessions) -> MigrationResult:
    """The import's result; it is abandoned when the offer's commit deadline passes first."""
    fut = asyncio.wrap_future(handle.future)
    try:
        return await asyncio.wait_for(asyncio.shield(fut), max(0.0, handle.offer.commit_by - time.time()))
    except TimeoutError:  # the source gives up now: never keep a copy (abandon undoes a late creation)
        await sessions.abandon_import(handle, "the commit deadline passed on the target")
        raise OpenAIError(504, "the session could not be imported before the offer's commit deadline",
                          code="timeout") from None
    except MigrationError as e:
        raise http_error(e) from None

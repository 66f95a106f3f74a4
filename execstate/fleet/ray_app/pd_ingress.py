"""The PD fleet's ingress: each prompt's prefill on a prefill replica, its decode on a decode replica
(docs/fleet.md, "PD as two deployments").

:class:`PDFleetIngress` is the fleet's ingress (``ingress.py``) with two engine deployments:
``prefill`` (replicas with ``kv_role`` ``kv_producer``) and ``engines``, the decode deployment
(``kv_both``: a decode replica loads a prefill's KV, and exports a session's KV when it migrates).
Every request but a prompt (sessions, ``/v1/models``, ``/metrics``, ``/v1/fleet/...``) is the plain
ingress's and goes to the decode deployment, which holds the sessions. For ``POST
/v1/completions`` and ``/v1/chat/completions`` it does what the PD proxy (``serve/pd/proxy.py``)
does, both replicas chosen by the fleet's router under the pairing rule of
``fleet/router/pd_pairing.py``:

1. **prefill**: the request with one token, no stream, ``kv_transfer_params={"do_remote_decode":
   true}`` (the proxy's ``prefill_body``) through the prefill handle, to a prefill replica of a
   version some decode replica runs, by prompt prefix and load; its answer (read whole) carries
   the handoff, signed by that replica with the fleet's secret and checked here (502
   ``invalid_handoff`` / ``no_handoff`` otherwise), and the version that computed it;
2. **decode**: the original request (a client's own ``kv_transfer_params`` stripped) with that
   handoff through the decode handle, bound to that version; the decode replica reads the KV
   from the prefill replica (NIXL, control channel) and its answer is streamed back as it comes.

The answer's headers name the decode replica (``x-execstate-replica`` and
``x-execstate-decode-replica``), the prefill replica (``x-execstate-prefill-replica``), the version
that served both (``x-execstate-weights-version``) and the prefill's prompt token sources
(``x-execstate-prefill-sources``, JSON: what the prefill replica's cache held). A replica that
fails before answering is excluded and the stage retried elsewhere (``MAX_ATTEMPTS``), as in the
plain ingress; a replica refusing the version (409 ``weights_version_mismatch``) likewise. No
version run on both sides (a rolling update between a pair's halves): the ingress waits (backing
off to 1 s), forgets the versions it knew and tries the pair again, up to ``pair_wait_s``, then
answers 503 ``no_version_pair`` (each try during such a window may cost a prefill: the replicas'
refusals, not extra calls, tell the ingress their versions). A
prefill whose decode never comes leaves its export pinned on the prefill replica until its TTL.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from ray.serve.handle import DeploymentHandle
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from execstate.fleet.ray_app.engine_replica import REPLICA_HEADER, VERSION_HEADER, VERSION_MISMATCH
from execstate.fleet.ray_app.ingress import MAX_ATTEMPTS, FleetIngress, _chunks, _relay, logger
from execstate.fleet.ray_app.pd_ops import PDFleetOps
from execstate.fleet.ray_app.prompt_route import prompt_route
from execstate.fleet.ray_app.session_settings import SessionSettings
from execstate.fleet.router.pd_pairing import DECODE, PREFILL, NoPair, VersionDirectory, decode_route, prefill_route
from execstate.fleet.router.policy import RouteRequest
from execstate.identity.secret_ring import SecretRing
from execstate.serve.pd.proxy import prefill_body
from execstate.transfer.handoff import HandoffError, HandoffTrust, wants_remote_prefill

PD_PATHS = ("/v1/completions", "/v1/chat/completions")
PREFILL_HEADER = "x-execstate-prefill-replica"
DECODE_HEADER = "x-execstate-decode-replica"
PREFILL_SOURCES_HEADER = "x-execstate-prefill-sources"
PAIR_WAIT_S = 30.0


class _Refused(Exception):  # noqa: N818 - every replica tried refused the stage's version
    pass


class PDFleetIngress(FleetIngress):
    def __init__(self, prefill: DeploymentHandle, decode: DeploymentHandle, model: str,
                 sessions: SessionSettings | None = None, pair_wait_s: float = PAIR_WAIT_S) -> None:
        super().__init__(decode, model, sessions)
        self.prefill = prefill
        self.directory = VersionDirectory()
        ring = SecretRing.resolve()  # the fleet's secret (fleet/ray_app/app.py sets it on every deployment)
        self.trust = HandoffTrust(ring) if ring is not None else None
        self.pair_wait_s = pair_wait_s
        self.ops = PDFleetOps(self)

    async def register(self, info: dict[str, Any]) -> None:
        await super().register(info)
        self.directory.record(info["replica_id"], info.get("role", DECODE), info.get("weights_version"))

    def handle_of(self, replica_id: str) -> DeploymentHandle:
        return self.prefill if self.directory.role_of(replica_id) == PREFILL else self.engines

    async def handle_http(self, request: Request) -> Response:
        if request.method != "POST" or request.url.path not in PD_PATHS:
            return await super().handle_http(request)
        raw = await request.body()
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return await super().handle_http(request)  # a decode replica answers the error
        body.pop("kv_transfer_params", None)  # only the prefill replica's handoff goes to the decode replica
        path = request.url.path
        route = await asyncio.to_thread(prompt_route, "POST", path, raw, self.tokenizer, None,
                                        self.tenant_of(request), self.sharing)
        headers = [(k, v) for k, v in request.headers.items()]
        deadline, delay = time.monotonic() + self.pair_wait_s, 0.1
        while True:
            try:
                return await self._pair(route, path, request.url.query, headers, body)
            except NoPair as e:
                if time.monotonic() > deadline:
                    return _error(503, f"{e}; retry later", "no_version_pair")
                await asyncio.sleep(delay)
                delay = min(1.0, delay * 2)
                self.directory.forget_versions()  # learn them again from the next answers and refusals

    async def _pair(self, route: RouteRequest, path: str, query: str, headers: list[tuple[str, str]],
                    body: dict[str, Any]) -> Response:
        """One try of the pair: prefill, then decode bound to its version. Raises NoPair."""
        try:
            p_head, p_chunks = await self._stage(self.prefill, PREFILL, lambda ex: prefill_route(
                route, self.directory, ex), path, query, headers, json.dumps(prefill_body(body)).encode())
        except _Refused:
            raise NoPair(self.directory.versions(PREFILL, self.draining) or set(),
                         self.directory.versions(DECODE, self.draining) or set()) from None
        p_rid, p_data = p_head["replica"], b"".join([c async for c in p_chunks])
        p_headers = {**dict(p_head["headers"]), PREFILL_HEADER: p_rid}
        if p_head["status"] != 200:
            p_headers.pop("content-length", None)
            return Response(p_data, p_head["status"], {**p_headers, REPLICA_HEADER: p_rid})
        answer = _json(p_data)
        kv = answer.get("kv_transfer_params")
        if not isinstance(kv, dict):
            return _error(502, f"prefill replica {p_rid} returned no kv_transfer_params", "no_handoff")
        if self.trust is not None and wants_remote_prefill(kv):
            try:
                self.trust.accept(kv)
            except HandoffError as e:
                return _error(502, f"prefill replica {p_rid} returned an invalid handoff: {e}", "invalid_handoff")
        version = p_headers[VERSION_HEADER]
        sources = (answer.get("usage") or {}).get("prompt_token_sources")
        d_body = json.dumps({**body, "kv_transfer_params": kv}).encode()
        try:
            d_head, d_chunks = await self._stage(self.engines, DECODE, lambda ex: decode_route(route, version, ex),
                                                 path, query, headers, d_body)
        except _Refused:
            raise NoPair({version}, self.directory.versions(DECODE, self.draining) or set()) from None
        d_rid = d_head["replica"]
        self.served[p_rid] += 1
        self.served[d_rid] += 1
        out = dict(d_head["headers"])
        out.update({REPLICA_HEADER: d_rid, DECODE_HEADER: d_rid, PREFILL_HEADER: p_rid})
        if sources is not None:
            out[PREFILL_SOURCES_HEADER] = json.dumps(sources, separators=(",", ":"))
        sse = out.get("content-type", "").startswith("text/event-stream")
        return StreamingResponse(_relay(d_chunks, d_rid, sse), d_head["status"], out)

    async def _stage(self, handle: DeploymentHandle, role: str, route_for: Callable[[set[str]], RouteRequest],
                     path: str, query: str, headers: list[tuple[str, str]],
                     payload: bytes) -> tuple[dict[str, Any], AsyncIterator[bytes]]:
        """One stage through ``handle``: the head and the rest of the chunks. A replica that fails
        before answering, or refuses the version, is excluded and another tried (``MAX_ATTEMPTS``);
        raises :class:`_Refused` when the replicas tried all refused the version."""
        exclude = set(self.draining)
        last: Exception | None = None
        for _ in range(MAX_ATTEMPTS):
            route = route_for(exclude)
            gen = handle.options(stream=True).forward.remote(route, "POST", path, query, headers, payload)
            try:
                head = await gen.__anext__()
            except Exception as e:  # noqa: BLE001 - a replica gone before answering: try another
                logger.warning("a %s replica failed before answering %s (%s); retrying elsewhere", role, path, e)
                last = e
                self.retried += 1
                continue
            rid = head["replica"]
            self.directory.record(rid, role, dict(head["headers"]).get(VERSION_HEADER))
            if head["status"] == 409:
                data = b"".join([c async for c in _chunks(gen)])
                if (_json(data).get("error") or {}).get("code") == VERSION_MISMATCH:
                    exclude.add(rid)
                    last = None
                    continue
                return head, _once(data)
            return head, _chunks(gen)
        if last is None:
            raise _Refused()
        raise RuntimeError(f"no {role} replica could answer POST {path}: {last}")


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


def _json(data: bytes) -> dict[str, Any]:
    try:
        out = json.loads(data)
    except ValueError:
        return {}
    return out if isinstance(out, dict) else {}


def _error(status: int, message: str, code: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "server_error", "param": None, "code": code}}, status)

"""The fleet's ingress (a Ray Serve deployment): every request and realtime socket to one engine replica.

The deployment is an ASGI ingress (``serve.ingress()`` on this class, ``app.py``): its app
(:meth:`FleetIngress.__serve_build_asgi_app__`, built when the replica starts) routes the realtime
WebSockets (``ws_route.WS_PATHS``) to :class:`~execstate.fleet.ray_app.ws_ingress.FleetSockets`
(each connection proxied to one replica: docs/fleet.md, "WebSockets"), answers ``GET /`` itself
(the fleet's landing page, ``landing.py``) and sends every other HTTP request to
``FleetIngress.handle_http``, which:

- ``/v1/fleet/...`` (the fleet's own operations, ``fleet_ops.py``): ``GET /v1/fleet/replicas``,
  ``POST /v1/fleet/drain`` ``{"replica"}``, ``POST /v1/fleet/update_weights``
  ``{"source", "weights_version"}``. On a keyed fleet each needs a key (401 without one), and the
  two that change the fleet a key of an operator tenant (``--fleet-operator``; 403 otherwise);
- anything else (``/v1/completions``, ``/v1/chat/completions``, ``/v1/sessions...``, ``/v1/models``,
  ``/metrics`` ...): builds its :class:`RouteRequest` (``prompt_route.py``: the prompt's tokens
  and salt, or the replica holding the session) and calls ``EngineReplica.forward`` through the
  engine deployment's handle, so the fleet's ``RequestRouter`` picks the replica; the answer is
  streamed back as it comes (SSE stays SSE) with the header ``x-execstate-replica`` naming the
  replica that served it. ``POST /v1/sessions`` records which replica opened the session (and
  its engine id and tenant); a session request goes there (``session_resume.py``: resumed on
  another replica from the shared tier when that replica is lost);
  ``DELETE /v1/sessions/{id}`` forgets it. A replica that fails before answering (gone, dead) is
  excluded and the request retried elsewhere, at most ``MAX_ATTEMPTS`` times; once an answer has
  started, a failure ends the stream.

One ingress replica keeps the session owners (``SessionReplicas``): deploy the ingress with one
replica (the default), or sessions opened through one ingress replica are unknown to the others.
Engine replicas register themselves (:meth:`register`) when they start.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any, cast

from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles

from execstate.engine.tokenizer import Tokenizer
from execstate.fleet.ray_app.engine_replica import REPLICA_HEADER, VERSION_HEADER
from execstate.fleet.ray_app.fleet_ops import FleetOps
from execstate.fleet.ray_app.landing import render_fleet_page
from execstate.fleet.ray_app.loopback import bind_replica_grpc_to_loopback
from execstate.fleet.ray_app.prompt_route import SessionReplicas, caller_of, prompt_route, session_of
from execstate.fleet.ray_app.session_resume import SessionLost, SessionResumed, SessionRouting
from execstate.fleet.ray_app.session_settings import SessionSettings
from execstate.fleet.ray_app.ws_ingress import FleetSockets
from execstate.fleet.ray_app.ws_route import WS_PATHS
from execstate.fleet.router.policy import RouteRequest
from execstate.identity.secret_ring import SecretRing
from execstate.identity.tenant import TenantId
from execstate.model.registry import resolve_model
from execstate.serve.landing import DOCS_PATH, docs_site_dir
from execstate.serve.principals import bearer_key

logger = logging.getLogger("execstate.fleet")
MAX_ATTEMPTS = 3
HTTP_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


class FleetIngress:
    def __init__(self, engines: DeploymentHandle, model: str, sessions: SessionSettings | None = None,
                 chat_template: str | None = None) -> None:
        """``chat_template``: the replicas' (``EngineConfig.chat_template``), so a chat prompt is routed by
        the tokens the replica will compute."""
        bind_replica_grpc_to_loopback()  # a single-machine fleet: Serve's replica gRPC server on loopback
        self.engines = engines
        settings = sessions or SessionSettings()
        self.keys = settings.keys()  # the tenant a session is resumed for, and a prompt is keyed for
        self.sharing = settings.sharing()
        self.operators = frozenset(settings.operators)  # tenants that may change the fleet (fleet_ops.py)
        self.sessions = SessionRouting(self, SecretRing.resolve())
        self.model = model
        path = resolve_model(model)
        self.tokenizer = Tokenizer(path, chat_template) if (path / "tokenizer.json").exists() else None
        self.owners = SessionReplicas()
        self.replicas: dict[str, dict[str, Any]] = {}  # replica id -> what it registered
        self.draining: set[str] = set()
        self.served: Counter[str] = Counter()  # replica id -> requests answered (bench, tests)
        self.retried = 0  # requests tried again elsewhere after a replica failed before answering
        self.ops = FleetOps(self)
        self.sockets = FleetSockets(self.place, self.owners, self.draining, self.record_session)

    def tenant_of(self, request: Request) -> TenantId | None:
        """The caller's tenant, as its replica will find it (None: a key no replica accepts)."""
        return self.keys.tenant_of(bearer_key(request.headers.get("authorization")))

    def __serve_build_asgi_app__(self) -> Starlette:
        """The ingress's ASGI app (Ray Serve calls it once the replica is built): the realtime
        WebSockets, the landing page at ``/`` (and the docs site at ``/docs/`` when one was built),
        then every HTTP path."""
        routes: list[Route | WebSocketRoute | Mount] = [WebSocketRoute(p, self.sockets.serve) for p in WS_PATHS]
        routes.append(Route("/", self.landing, methods=["GET", "HEAD"]))
        docs = docs_site_dir()
        if docs is not None:
            routes.append(Mount(DOCS_PATH, StaticFiles(directory=docs, html=True)))
        routes.append(Route("/{path:path}", self.handle_http, methods=HTTP_METHODS))
        return Starlette(routes=routes)

    async def landing(self, request: Request) -> HTMLResponse:
        """The fleet's landing page (``landing.py``): what it serves now; names no model on a keyed fleet."""
        return HTMLResponse(render_fleet_page(self.model, self.replicas, self.draining, not self.keys.open,
                                              docs_site_dir() is not None))

    async def place(self, route: RouteRequest) -> tuple[str, str]:
        """The replica the fleet's router chooses for ``route`` (a realtime socket): its id and URL."""
        info = await self.engines.describe.remote(route)
        return info["replica_id"], info["url"]

    def record_session(self, caller: str, session_id: str, replica: str, authorization: str | None) -> None:
        """``session_id`` (opened over HTTP or a socket) is held by ``replica``: with the replica's
        engine id and the caller's tenant, what resuming it after the replica's loss needs."""
        engine = self.replicas.get(replica, {}).get("engine_id")
        tenant = self.keys.tenant_of(_bearer(authorization))
        self.owners.set(caller, session_id, replica, authorization, engine_id=engine, tenant=tenant)

    async def register(self, info: dict[str, Any]) -> None:
        """An engine replica announces itself (id, URL, KV events endpoints) when it starts; one on
        other weights than the fleet's after an update is switched to them (``FleetOps.on_register``)."""
        self.replicas[info["replica_id"]] = info
        self.ops.on_register(info)

    def handle_of(self, replica_id: str) -> DeploymentHandle:
        """The handle of the deployment ``replica_id`` belongs to (the fleet operations address it)."""
        return self.engines

    async def handle_http(self, request: Request) -> Response:
        path = request.url.path
        if path.startswith("/v1/fleet/"):
            tenant = self.tenant_of(request)
            if tenant is None:
                return JSONResponse({"error": {"message": "Incorrect or missing API key: the fleet's operations "
                                               "need one", "type": "invalid_request_error",
                                               "code": "invalid_api_key"}}, 401)
            return await self.ops.handle(request, self.keys.open or tenant in self.operators)
        body = await request.body()
        caller = caller_of(request.headers.get("authorization"))
        sid = session_of(path)
        headers = [(k, v) for k, v in request.headers.items()]
        if sid is not None:
            try:
                head, stream = await self.sessions.send(caller, sid, request.method, path, request.url.query,
                                                        headers, body)
            except SessionLost as e:
                status = 503 if e.retry else 404
                return JSONResponse({"error": {"message": str(e), "type": "session_lost", "code": status}}, status)
            except SessionResumed as e:
                return JSONResponse({"error": {"message": str(e), "type": "session_resumed", "code": 503},
                                     "step_index": e.step_index}, 503)
        else:
            route = await asyncio.to_thread(prompt_route, request.method, path, body, self.tokenizer, None,
                                            self.tenant_of(request), self.sharing)
            head, stream = await self.send(route, request.method, path, request.url.query, headers, body)
        replica = head["replica"]
        self.served[replica] += 1
        out_headers = dict(head["headers"])
        out_headers[REPLICA_HEADER] = replica
        if request.method == "POST" and path == "/v1/sessions" and head["status"] == 200:
            data = b"".join([c async for c in stream])
            opened = json.loads(data).get("session_id")
            if isinstance(opened, str):
                self.record_session(caller, opened, replica, request.headers.get("authorization"))
            return Response(data, head["status"], out_headers)
        if request.method == "DELETE" and sid is not None and head["status"] == 200:
            self.owners.drop(caller, sid)
        sse = out_headers.get("content-type", "").startswith("text/event-stream")
        return StreamingResponse(_relay(stream, replica, sse), head["status"], out_headers)

    async def send(self, route: RouteRequest, method: str, path: str, query: str, headers: list[tuple[str, str]],
                   body: bytes) -> tuple[dict[str, Any], AsyncIterator[bytes]]:
        """Forward through the router; the head and the rest of the body's chunks. Retries on
        another replica when one fails before its head arrived. After a completed weight update a
        prompt goes only to replicas registered on the fleet's version, and one that answers it on
        another version (``409 weights_version_mismatch``: Ray listed it before it registered) is
        excluded and another tried; its refusal is the answer when no replica is left."""
        excluded = set(self.draining)
        pinned = None if route.session_replica is not None else self.ops.pinned_version()
        if pinned is not None:
            excluded |= {rid for rid, info in self.replicas.items() if info.get("weights_version") != pinned}
        last: Exception | None = None
        refused: tuple[dict[str, Any], bytes] | None = None
        for _ in range(MAX_ATTEMPTS):
            r = RouteRequest(route.token_ids, route.scope, route.session_replica, tuple(sorted(excluded)),
                             require_version=pinned)
            gen = cast(DeploymentResponseGenerator,  # stream=True
                       self.engines.options(stream=True).forward.remote(r, method, path, query, headers, body))
            try:
                head = await gen.__anext__()
            except Exception as e:  # noqa: BLE001 - a replica gone before answering: try another
                logger.warning("a replica failed before answering %s %s (%s); retrying elsewhere", method, path, e)
                last = e
                self.retried += 1
                if route.session_replica is not None:
                    break  # a session lives on one replica: no other can answer for it
                excluded.update(self._dead())
                continue
            if pinned is not None and head["status"] == 409 and dict(head["headers"]).get(VERSION_HEADER) != pinned:
                refused = head, b"".join([c async for c in _chunks(gen)])
                excluded.add(head["replica"])  # not yet on the fleet's version: another answers
                continue
            return head, _chunks(gen)
        if refused is not None:
            return refused[0], _one(refused[1])
        raise RuntimeError(f"no replica could answer {method} {path}: {last}") from last

    def _dead(self) -> set[str]:
        return set()  # Ray removes dead replicas from the candidates; draining ones are excluded already


def _bearer(authorization: str | None) -> str | None:
    if authorization is None or not authorization.lower().startswith("bearer "):
        return None
    return authorization[7:].strip()


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def _chunks(gen: Any) -> AsyncIterator[bytes]:
    async for chunk in gen:
        yield chunk


async def _relay(chunks: AsyncIterator[bytes], replica: str, sse: bool) -> AsyncIterator[bytes]:
    """The answer's chunks; if the replica fails once the answer started (killed mid-stream), an
    SSE stream ends with an ``error`` event naming the replica (no ``[DONE]``), any other answer is
    cut (the client sees an incomplete body). Never retried: part of the answer was sent."""
    try:
        async for chunk in chunks:
            yield chunk
    except Exception as e:  # noqa: BLE001 - the replica died or its stream broke mid-answer
        logger.warning("replica %s failed mid-answer: %s", replica, e)
        if not sse:
            raise
        err = {"error": {"message": f"the replica serving this stream failed mid-answer ({replica}: "
                                    f"{type(e).__name__}); the answer is incomplete", "type": "replica_failed",
                         "code": 503}}
        yield f"data: {json.dumps(err)}\n\n".encode()

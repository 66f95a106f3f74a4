"""One engine replica of the fleet: an execstate server inside a Ray Serve replica (docs/fleet.md).

Each replica builds an ``LLMEngine`` (KV events on, on ephemeral ports of its node), the same
OpenAI-compatible app ``execstate serve`` runs (``serve/app.py``: completions, chat, sessions,
migration, realtime, metrics) and serves it with uvicorn on a free port of its node, on its own
thread. Requests reach it through :meth:`EngineReplica.forward`, which the ingress calls through
a Ray Serve handle (so the fleet's ``RequestRouter`` chose this replica) and which relays the HTTP
request to that local server and streams the answer back, chunk by chunk (SSE included), its head
naming the replica and the weights version that served it (``version_gate.py``: a request holds
a reading pass to its last chunk, a weight update the writing pass, so none straddles a switch). The
same port is where other replicas deliver migrated sessions (two-phase hand-over, signed with the
fleet's shared secret ``EXECSTATE_KV_SECRET``) and where the ingress wakes a lost replica's session
from its copy in the shared tier (``POST /v1/sessions/import {"reference"}``). With a Redis tier
(``offload_redis_url``), a :class:`~execstate.fleet.ray_app.session_copies.CopyLoop` copies the
replica's live sessions there every ``SessionSettings.copy_every_s``; idle sessions hibernate after
``hibernate_after_s``; ``api_keys_file`` names the tenants (``session_settings.py``).

``role``: ``"engine"`` in a plain fleet; ``"prefill"`` or ``"decode"`` in a PD fleet (``app.py``),
whose ``kv_transfer`` (the ``--kv-transfer-config`` JSON) makes it a KV producer or a consumer; the
role is in its registration and routing stats, with its weights version.

Call order: ``__init__`` (engine, app, server; registers with the ingress) → ``forward`` /
``describe`` / ``set_migration_peers`` / ``update_weights`` any number of times →
``__del__`` (Ray Serve stops the replica: server and engine shut down).

``record_routing_stats`` (Ray Serve calls it every ``request_routing_stats_period_s``) tells the
router where this replica's KV events are, its provenance (the router computes the request's keys
under it), its block size and load.

Addresses: the replica binds its HTTP server, its KV events sockets and its KV connector's side
channel (what a migration target pulls a session's KV through) on ``host`` and advertises the
same address to the ingress, the router and the other replicas. ``127.0.0.1`` (the default) keeps
a single-host fleet off the network; :data:`NODE_IP` (``"node"``) takes the address of the Ray
node the replica runs on (``ray start --node-ip-address``), so replicas on several hosts reach
each other's ports (docs/fleet.md "Several hosts").
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import socket
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import uvicorn
from ray import serve

from execstate.engine.async_engine import AsyncEngine
from execstate.engine.config import EngineConfig
from execstate.fleet.ray_app.loopback import bind_replica_grpc_to_loopback
from execstate.fleet.ray_app.session_copies import CopyLoop
from execstate.fleet.ray_app.session_settings import SessionSettings
from execstate.fleet.ray_app.version_gate import VersionGate
from execstate.fleet.router.policy import RouteRequest
from execstate.serve.app import build_app, serve_policy
from execstate.serve.kv_transfer_config import KVTransferConfig
from execstate.serve.limits import ServingLimits
from execstate.serve.metrics import ServingMetrics
from execstate.serve.realtime.lm.endpoint import DEFAULT_GRACE_S
from execstate.serve.sessions.targets import MigrationTargets
from execstate.session.lm.async_sessions import AsyncSessions
from execstate.state.kv_events.config import KVEventsConfig

logger = logging.getLogger("execstate.fleet")
REPLICA_HEADER = "x-execstate-replica"
VERSION_HEADER = "x-execstate-weights-version"  # the weights version that served the request
_HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection"}
KV_BOTH = {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_load_failure_policy": "recompute"}
NODE_IP = "node"  # a replica host meaning: the IP address of the Ray node the replica runs on
ENGINE_ROLE = "engine"  # a plain fleet's replica; a PD fleet's are "prefill" and "decode" (pd_pairing.py)
VERSION_MISMATCH = "weights_version_mismatch"  # the code of a refusal: asked for a version it does not run


def resolve_host(host: str) -> str:
    """The address a replica binds and advertises: ``host``, or its Ray node's IP for :data:`NODE_IP`."""
    if host == NODE_IP:
        import ray

        return ray.util.get_node_ip_address()
    return host


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def replica_id() -> str:
    """This Ray Serve replica's full id (what the router's ``RunningReplica`` calls it)."""
    return serve.get_replica_context().replica_id.to_full_id_str()


class EngineReplica:
    def __init__(self, model: str, served_model_name: str, engine_kwargs: dict[str, Any] | None = None,
                 host: str = "127.0.0.1", ingress: tuple[str, str] | None = None,
                 sessions: SessionSettings | None = None, realtime_grace_s: float = DEFAULT_GRACE_S,
                 role: str = ENGINE_ROLE, kv_transfer: dict[str, Any] | None = None,
                 limits: ServingLimits | None = None) -> None:
        bind_replica_grpc_to_loopback()  # a single-machine fleet: Serve's replica gRPC server on loopback
        host = self.host = resolve_host(host)
        events = KVEventsConfig(enable_kv_cache_events=True, endpoint=f"tcp://{host}:0",
                                replay_endpoint=f"tcp://{host}:0")
        # the PD connector (kv_both) moves a migrated session's KV; hand-overs are signed with the
        # fleet's secret (EXECSTATE_KV_SECRET, set on every replica by fleet/ray_app/app.py)
        kv = KVTransferConfig(**(kv_transfer or KV_BOTH), kv_connector_extra_config={"side_channel_host": host})
        config = EngineConfig(model=model, kv_events=events, kv_transfer=kv.pd_config(), **(engine_kwargs or {}))
        metrics = ServingMetrics()
        limits = limits or ServingLimits()  # the server's bounds, as `execstate serve` gives one engine
        self.engine = AsyncEngine.from_config(config, limits.max_waiting_requests, on_transfer=metrics.record_transfer)
        self.replica_id = replica_id()
        self.role = role
        self.block_size = config.block_size
        trust = self.engine.handoff_trust
        rs = sessions or SessionSettings()
        policy = serve_policy(idle_ttl_s=rs.idle_ttl_s, quotas=rs.quotas, hibernate_after_s=rs.hibernate_after_s)
        sharing = rs.sharing()
        self.sessions = AsyncSessions(self.engine, policy, sharing)
        self.app = build_app(self.engine, served_model_name, metrics=metrics, handoff_trust=trust,
                             migration_targets=MigrationTargets(), sessions=self.sessions, policy=policy,
                             sharing=sharing, keys=rs.keys(), realtime_grace_s=realtime_grace_s, limits=limits)
        summary = self.engine.summary_blocking()  # what it was built with: its id, tier, feed, version
        self.engine_id, shared = summary.home.engine_id, summary.home.shared_tier
        self.copies = CopyLoop(self.engine, self.sessions, rs.copy_every_s).start() \
            if shared and rs.copy_every_s is not None else None
        port = _free_port(host)
        self.url = f"http://{host}:{port}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, host=host, port=port, log_level="warning"))
        self._thread = threading.Thread(target=self.server.run, name="execstate-replica-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"the replica's HTTP server did not start on {self.url}")
            time.sleep(0.02)
        self.client = httpx.AsyncClient(base_url=self.url, timeout=None)
        self.gate = VersionGate()
        published = summary.kv_events
        assert published is not None  # the engine was configured with kv_events above
        self.kv_endpoint, self.kv_replay_endpoint = published.endpoint, published.replay_endpoint
        if ingress is not None:
            version = summary.provenance.weights_version
            threading.Thread(target=self._register, args=(*ingress, version), name="execstate-replica-register",
                             daemon=True).start()

    def _register(self, deployment: str, app_name: str, version: str) -> None:
        """Announce this replica (its role and weights version at start) to the ingress (retried
        while the ingress starts)."""
        info = {"replica_id": self.replica_id, "url": self.url, "kv_events": self.kv_endpoint,
                "kv_replay": self.kv_replay_endpoint, "pid": os.getpid(), "engine_id": self.engine_id,
                "shared_copies": self.copies is not None, "role": self.role, "weights_version": version}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                serve.get_deployment_handle(deployment, app_name).register.remote(info).result(timeout_s=10)
                return
            except Exception:  # noqa: BLE001 - the ingress is not up yet
                time.sleep(0.5)
        logger.error("replica %s could not register with the ingress %s", self.replica_id, deployment)

    # -- routing ----------------------------------------------------------------------------------

    async def record_routing_stats(self) -> dict[str, Any]:
        load = await self.engine.load()
        stats = {"queue_len": load.num_running + load.num_waiting, "kv_usage": load.kv_usage,
                 "provenance": dataclasses.asdict(load.provenance), "prefix_hit_tokens": load.prefix_hit_tokens,
                 "prefix_lookup_tokens": load.prefix_lookup_tokens}
        return {**stats, "kv_events": self.kv_endpoint, "kv_replay": self.kv_replay_endpoint,
                "block_size": self.block_size, "url": self.url, "pid": os.getpid(), "role": self.role}

    async def describe(self, _route: RouteRequest | None = None) -> dict[str, Any]:
        """This replica's id, URL and routing stats (the ingress's directory, drain, tests)."""
        return {"replica_id": self.replica_id, **await self.record_routing_stats()}

    # -- requests ---------------------------------------------------------------------------------

    async def forward(self, route: RouteRequest, method: str, path: str, query: str, headers: list[tuple[str, str]],
                      body: bytes) -> AsyncIterator[dict[str, Any] | bytes]:
        """Relay one HTTP request to this replica's server: yields the head (``status``,
        ``headers``, ``replica``) first, then the body's chunks as they come (a stream stays one).
        A request bound to weights versions this replica does not run (``route.weights_versions``:
        the decode half of a PD pair; ``route.require_version``: the fleet's version after an
        update) is refused with a 409 ``weights_version_mismatch`` naming its version, before the
        engine sees it."""
        send_headers = [(k, v) for k, v in headers if k.lower() not in _HOP_HEADERS]
        request = self.client.build_request(method, path + (f"?{query}" if query else ""), headers=send_headers,
                                            content=body)
        async with self.gate.reading():  # no weights switch until this request's last chunk
            version = await self.engine.weights_version()
            wanted = route.weights_versions if route.require_version is None else (route.require_version,)
            if (wanted is not None and version not in wanted) or (
                    route.weights_versions is not None and version not in route.weights_versions):
                yield {"status": 409, "headers": [("content-type", "application/json"), (VERSION_HEADER, version)],
                       "replica": self.replica_id}
                yield _mismatch(version, wanted or ())
                return
            response = await self.client.send(request, stream=True)
            try:
                head = [(k, v) for k, v in response.headers.items() if k.lower() not in _HOP_HEADERS]
                head.append((VERSION_HEADER, version))
                yield {"status": response.status_code, "headers": head, "replica": self.replica_id}
                async for chunk in response.aiter_raw():
                    yield chunk
            finally:
                await response.aclose()

    # -- fleet operations -------------------------------------------------------------------------

    async def set_migration_peers(self, _route: RouteRequest, urls: list[str]) -> list[str]:
        """The migration allow-list of this replica: the fleet's other replicas (the fleet sets it
        before a drain; clients cannot). Returns it."""
        targets = MigrationTargets.parse([u for u in urls if u != self.url])
        self.app.state.migrations.targets = targets
        return [t.base for t in targets.targets]

    async def update_weights(self, route: RouteRequest, source: str, weights_version: str) -> str:
        """Load new weights (a checkpoint directory) under ``weights_version``; the new version.
        Addressed to one replica (``route.session_replica``): another that receives it (the router
        did not list the addressee yet) refuses with ``ValueError`` and loads nothing."""
        if route.session_replica is not None and route.session_replica != self.replica_id:
            raise ValueError(f"update_weights addressed to {route.session_replica} reached {self.replica_id}")
        async with self.gate.writing():  # the requests in flight finish first; new ones wait for the switch
            result = await self.engine.update_weights(source, weights_version, "drain")
        del result
        return await self.engine.weights_version()

    async def healthy(self, _route: RouteRequest | None = None) -> bool:
        return self.engine.is_healthy

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            if self.copies is not None:
                self.copies.stop()
        with contextlib.suppress(Exception):
            self.server.should_exit = True
            self._thread.join(5)
        with contextlib.suppress(Exception):
            self.engine.close_kv_events(timeout=5)
            self.engine.shutdown()
        with contextlib.suppress(Exception):
            asyncio.get_event_loop().run_until_complete(self.client.aclose())


def _mismatch(version: str, wanted: tuple[str, ...]) -> bytes:
    message = f"this replica runs weights version {version}, the request needs {', '.join(wanted)}"
    return json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                 "code": VERSION_MISMATCH}}).encode()

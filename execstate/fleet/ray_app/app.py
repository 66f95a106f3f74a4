"""Build the fleet's Ray Serve application (docs/fleet.md).

:func:`fleet_app` returns the application for ``serve.run``: an ingress deployment
(:class:`~execstate.fleet.ray_app.ingress.FleetIngress`, one replica, Ray Serve's HTTP proxy in
front) bound to an engine deployment of ``replicas`` :class:`~execstate.fleet.ray_app.engine_replica.EngineReplica`
replicas routed by :class:`~execstate.fleet.ray_app.request_router.ExecstateRequestRouter`. On an
existing cluster::

    import ray
    from ray import serve
    from execstate.fleet.ray_app.app import fleet_app

    ray.init(address="auto")
    serve.run(fleet_app("smollm2-moe", replicas=3), name="execstate", route_prefix="/")

``execstate serve MODEL --ray --replicas N`` does the same on a local cluster it starts
(:func:`run_fleet`). Every replica gets the fleet's shared secret (``EXECSTATE_KV_SECRET``: the
caller's, else a fresh random one) so sessions can move between them.
"""

from __future__ import annotations

import argparse
import os
import secrets
import time
from typing import Any

from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.deployment import Application

from execstate.fleet.ray_app.engine_replica import EngineReplica
from execstate.fleet.ray_app.ingress import FleetIngress
from execstate.fleet.ray_app.request_router import ExecstateRequestRouter
from execstate.transfer.secrets import SECRET_ENV

INGRESS = "FleetIngress"
ENGINES = "EngineReplica"
APP_NAME = "execstate"
STATS_PERIOD_S = 0.5  # how often the router gets each replica's routing stats (load, KV events endpoints)


def fleet_app(model: str, replicas: int = 2, served_model_name: str | None = None,
              engine_kwargs: dict[str, Any] | None = None, router: dict[str, Any] | None = None,
              app_name: str = APP_NAME, replica_cpus: float = 1.0, secret: str | None = None,
              realtime_grace_s: float = 0.0) -> Application:
    """The application (module docstring). ``engine_kwargs``: ``EngineConfig`` fields of every
    replica; ``router``: ``request_router_kwargs`` (``policy`` and ``RouterKnobs`` fields);
    ``replica_cpus``: Ray CPUs reserved per engine replica; ``realtime_grace_s``: how long a
    replica keeps the sessions of a dropped ``/v1/realtime`` socket for a reconnect's
    ``session.resume`` (``execstate serve --realtime-grace-s``)."""
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    env = {SECRET_ENV: secret or os.environ.get(SECRET_ENV) or secrets.token_hex(32)}
    engines = serve.deployment(
        EngineReplica, name=ENGINES, num_replicas=replicas, max_ongoing_requests=64,
        ray_actor_options={"num_cpus": replica_cpus, "runtime_env": {"env_vars": env}},
        request_router_config=RequestRouterConfig(
            request_router_class=ExecstateRequestRouter, request_router_kwargs=dict(router or {}),
            request_routing_stats_period_s=STATS_PERIOD_S, request_routing_stats_timeout_s=5.0),
    ).bind(model, served_model_name or model, engine_kwargs or {}, "127.0.0.1", (INGRESS, app_name), realtime_grace_s)
    ingress = serve.deployment(serve.ingress()(FleetIngress), name=INGRESS, num_replicas=1, max_ongoing_requests=1000,
                               ray_actor_options={"num_cpus": 0})
    return ingress.bind(engines, model)


def run_fleet(args: argparse.Namespace) -> int:
    """``execstate serve MODEL --ray --replicas N``: a local Ray cluster, the fleet on
    ``--host``/``--port`` (Ray Serve's HTTP proxy), until interrupted."""
    import ray

    ray.init(num_cpus=max(2, os.cpu_count() or 2), include_dashboard=False, ignore_reinit_error=True)
    serve.start(http_options={"host": args.host, "port": args.port})
    kwargs = {"block_size": args.block_size, "seed": args.seed, "enable_return_routed_experts":
              args.enable_return_routed_experts, "max_model_len": args.max_model_len, "dtype": args.dtype,
              "kernels": args.kernels}
    serve.run(fleet_app(str(args.model), args.replicas, args.served_model_name, kwargs,
                        realtime_grace_s=args.realtime_grace_s), name=APP_NAME, route_prefix="/")
    print(f"execstate fleet: {args.replicas} replicas of {args.model} on http://{args.host}:{args.port} "
          "(Ray Serve; /v1/fleet/replicas lists them)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()
        ray.shutdown()
    return 0

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

``fleet_app(..., pd=(P, D))`` (``execstate serve MODEL --ray --pd P,D``) builds a PD fleet instead:
a prefill deployment of ``P`` replicas (``kv_role`` ``kv_producer``) and a decode deployment of
``D`` replicas (``kv_both``), each routed by its own ``ExecstateRequestRouter``, behind
:class:`~execstate.fleet.ray_app.pd_ingress.PDFleetIngress` (which gets the secret too: it checks
the prefill replicas' signed handoffs). Route records travel with the KV when the engines return
them (``enable_return_routed_experts``).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import time
from typing import Any

from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.deployment import Application

from execstate.fleet.ray_app.engine_replica import EngineReplica
from execstate.fleet.ray_app.ingress import FleetIngress
from execstate.fleet.ray_app.pd_ingress import PDFleetIngress
from execstate.fleet.ray_app.request_router import ExecstateRequestRouter
from execstate.transfer.secrets import SECRET_ENV

INGRESS = "FleetIngress"
ENGINES = "EngineReplica"
PREFILL_ENGINES, DECODE_ENGINES = "PrefillReplica", "DecodeReplica"  # the deployments of a PD fleet
APP_NAME = "execstate"
STATS_PERIOD_S = 0.5  # how often the router gets each replica's routing stats (load, KV events endpoints)


def fleet_app(model: str, replicas: int = 2, served_model_name: str | None = None,
              engine_kwargs: dict[str, Any] | None = None, router: dict[str, Any] | None = None,
              app_name: str = APP_NAME, replica_cpus: float = 1.0, secret: str | None = None,
              pd: tuple[int, int] | None = None) -> Application:
    """The application (module docstring). ``engine_kwargs``: ``EngineConfig`` fields of every
    replica; ``router``: ``request_router_kwargs`` (``policy`` and ``RouterKnobs`` fields);
    ``replica_cpus``: Ray CPUs reserved per engine replica; ``pd``: (prefill replicas, decode
    replicas) for a PD fleet (``replicas`` is then unused)."""
    env = {SECRET_ENV: secret or os.environ.get(SECRET_ENV) or secrets.token_hex(32)}
    kwargs = engine_kwargs or {}
    name = served_model_name or model

    def engines(deployment: str, n: int, *role_args: str) -> Application:
        return serve.deployment(
            EngineReplica, name=deployment, num_replicas=n, max_ongoing_requests=64,
            ray_actor_options={"num_cpus": replica_cpus, "runtime_env": {"env_vars": env}},
            request_router_config=RequestRouterConfig(
                request_router_class=ExecstateRequestRouter, request_router_kwargs=dict(router or {}),
                request_routing_stats_period_s=STATS_PERIOD_S, request_routing_stats_timeout_s=5.0),
        ).bind(model, name, kwargs, "127.0.0.1", (INGRESS, app_name), *role_args)

    if pd is None:
        if replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {replicas}")
        ingress = serve.deployment(FleetIngress, name=INGRESS, num_replicas=1, max_ongoing_requests=1000,
                                   ray_actor_options={"num_cpus": 0})
        return ingress.bind(engines(ENGINES, replicas), model)
    n_prefill, n_decode = pd
    if n_prefill < 1 or n_decode < 1:
        raise ValueError(f"a PD fleet needs at least one prefill and one decode replica, got {pd}")
    routes = bool(kwargs.get("enable_return_routed_experts"))
    producer = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_producer",
                           "enable_routed_experts_transfer": routes})
    both = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
                       "enable_routed_experts_transfer": routes})
    ingress = serve.deployment(PDFleetIngress, name=INGRESS, num_replicas=1, max_ongoing_requests=1000,
                               ray_actor_options={"num_cpus": 0, "runtime_env": {"env_vars": env}})
    return ingress.bind(engines(PREFILL_ENGINES, n_prefill, "prefill", producer),
                        engines(DECODE_ENGINES, n_decode, "decode", both), model)


def run_fleet(args: argparse.Namespace) -> int:
    """``execstate serve MODEL --ray --replicas N``: a local Ray cluster, the fleet on
    ``--host``/``--port`` (Ray Serve's HTTP proxy), until interrupted."""
    import ray

    ray.init(num_cpus=max(2, os.cpu_count() or 2), include_dashboard=False, ignore_reinit_error=True)
    serve.start(http_options={"host": args.host, "port": args.port})
    kwargs = {"block_size": args.block_size, "seed": args.seed, "enable_return_routed_experts":
              args.enable_return_routed_experts, "max_model_len": args.max_model_len, "dtype": args.dtype,
              "kernels": args.kernels}
    pd = getattr(args, "pd", None)
    serve.run(fleet_app(str(args.model), args.replicas, args.served_model_name, kwargs, pd=pd), name=APP_NAME,
              route_prefix="/")
    shape = f"{args.replicas} replicas" if pd is None else f"{pd[0]} prefill + {pd[1]} decode replicas"
    print(f"execstate fleet: {shape} of {args.model} on http://{args.host}:{args.port} "
          "(Ray Serve; /v1/fleet/replicas lists them)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()
        ray.shutdown()
    return 0

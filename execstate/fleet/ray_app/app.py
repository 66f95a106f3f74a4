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

On several hosts (``ray start --head --node-ip-address H --resources '{"execstate_engine": 1}'``
on one, ``ray start --address H:PORT --node-ip-address W --resources ...`` on the others), pass
``replica_host=NODE_IP`` (each replica binds and advertises its node's address, so the others
reach it) and ``replica_resources={"execstate_engine": 1}`` (one engine replica per node that
offers the resource). ``execstate serve MODEL --ray --replicas N`` does the same on a local
cluster it starts (:func:`run_fleet`). Every replica gets the fleet's shared secret
(``EXECSTATE_KV_SECRET``: the caller's, else a fresh random one) so sessions can move between
them; the ingress gets it too (it signs the references that resume a lost replica's sessions from
the shared tier, ``shared_tier``).

``fleet_app(..., pd=(P, D))`` (``execstate serve MODEL --ray --pd P,D``) builds a PD fleet instead:
a prefill deployment of ``P`` replicas (``kv_role`` ``kv_producer``) and a decode deployment of
``D`` replicas (``kv_both``), each routed by its own ``ExecstateRequestRouter``, behind
:class:`~execstate.fleet.ray_app.pd_ingress.PDFleetIngress` (which checks the prefill replicas'
signed handoffs). Route records travel with the KV when the engines return them
(``enable_return_routed_experts``).
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import sys
import time
from typing import Any, cast

from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.deployment import Application, Deployment

from execstate.fleet.cluster_plan import FleetPlanError, replica_cpus
from execstate.fleet.ray_app.engine_replica import NODE_IP, EngineReplica
from execstate.fleet.ray_app.ingress import FleetIngress
from execstate.fleet.ray_app.pd_ingress import PDFleetIngress
from execstate.fleet.ray_app.request_router import ExecstateRequestRouter
from execstate.fleet.ray_app.session_settings import SessionSettings
from execstate.identity.secret_ring import SECRET_ENV
from execstate.serve.limits import ServingLimits
from execstate.serve.server import limits_from_args, quotas_from_args

__all__ = ["NODE_IP", "fleet_app", "fleet_session_settings", "run_fleet", "watch_fleet"]
logger = logging.getLogger("execstate.fleet")
INGRESS = "FleetIngress"
ENGINES = "EngineReplica"
PREFILL_ENGINES, DECODE_ENGINES = "PrefillReplica", "DecodeReplica"  # the deployments of a PD fleet
APP_NAME = "execstate"
STATS_PERIOD_S = 0.5  # how often the router gets each replica's routing stats (load, KV events endpoints)


def fleet_app(model: str, replicas: int = 2, served_model_name: str | None = None,
              engine_kwargs: dict[str, Any] | None = None, router: dict[str, Any] | None = None,
              app_name: str = APP_NAME, replica_cpus: float = 1.0, secret: str | None = None,
              replica_host: str = "127.0.0.1", replica_resources: dict[str, float] | None = None,
              shared_tier: str | None = None, sessions: SessionSettings | None = None,
              realtime_grace_s: float = 0.0, pd: tuple[int, int] | None = None,
              limits: ServingLimits | None = None) -> Application:
    """The application (module docstring). ``engine_kwargs``: ``EngineConfig`` fields of every
    replica; ``router``: ``request_router_kwargs`` (``policy`` and ``RouterKnobs`` fields);
    ``replica_cpus``: Ray CPUs reserved per engine replica; ``replica_host``: the address each
    replica binds and advertises (``NODE_IP``: its Ray node's); ``replica_resources``: custom Ray
    resources each engine replica reserves (placement: only nodes started with them take one);
    ``shared_tier``: a Redis URL, every replica's shared tier (``offload_redis_url``), where
    replicas keep copies of their live sessions so a lost replica's sessions resume elsewhere;
    ``sessions``: hibernation, copy period, API keys (``session_settings.py``);
    ``realtime_grace_s``: how long a replica keeps the sessions of a dropped ``/v1/realtime``
    socket for a reconnect's ``session.resume`` (``execstate serve --realtime-grace-s``); ``pd``:
    (prefill replicas, decode replicas) for a PD fleet (``replicas`` is then unused); ``limits``: each
    replica's bounds on one request and on its waiting queue (``ServingLimits``, as on one server)."""
    if not replica_host:
        raise ValueError("replica_host must be an address or NODE_IP")
    kwargs = dict(engine_kwargs or {})
    if shared_tier is not None:
        kwargs["offload_redis_url"] = shared_tier
    settings = sessions or SessionSettings()
    env = {SECRET_ENV: secret or os.environ.get(SECRET_ENV) or secrets.token_hex(32)}
    actor: dict[str, Any] = {"num_cpus": replica_cpus, "runtime_env": {"env_vars": env}}
    if replica_resources:
        actor["resources"] = dict(replica_resources)
    name = served_model_name or model

    def engines(deployment: str, n: int, *role_args: Any) -> Application:
        # Ray types serve.deployment(cls, **options) as its decorator form, and its pydantic-v1
        # RequestRouterConfig's fields as dicts: the casts and ignores below say what Ray returns and takes.
        return cast(Deployment, serve.deployment(
            EngineReplica, name=deployment, num_replicas=n, max_ongoing_requests=64,
            ray_actor_options=actor,
            request_router_config=RequestRouterConfig(
                request_router_class=ExecstateRequestRouter,  # type: ignore[arg-type]
                request_router_kwargs=dict(router or {}),
                request_routing_stats_period_s=STATS_PERIOD_S,  # type: ignore[arg-type]
                request_routing_stats_timeout_s=5.0),  # type: ignore[arg-type]
        )).bind(model, name, kwargs, replica_host, (INGRESS, app_name), settings, realtime_grace_s, *role_args,
                limits=limits)

    ingress_actor = {"num_cpus": 0, "runtime_env": {"env_vars": env}}
    if pd is None:
        if replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {replicas}")
        ingress = cast(Deployment, serve.deployment(serve.ingress()(FleetIngress), name=INGRESS, num_replicas=1,
                                                    max_ongoing_requests=1000, ray_actor_options=ingress_actor))
        return ingress.bind(engines(ENGINES, replicas), model, settings, chat_template=kwargs.get("chat_template"))
    n_prefill, n_decode = pd
    if n_prefill < 1 or n_decode < 1:
        raise ValueError(f"a PD fleet needs at least one prefill and one decode replica, got {pd}")
    routes = bool(kwargs.get("enable_return_routed_experts"))
    producer = {"kv_connector": "NixlConnector", "kv_role": "kv_producer", "enable_routed_experts_transfer": routes}
    both = {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
            "enable_routed_experts_transfer": routes}
    ingress = cast(Deployment, serve.deployment(serve.ingress()(PDFleetIngress), name=INGRESS, num_replicas=1,
                                                max_ongoing_requests=1000, ray_actor_options=ingress_actor))
    return ingress.bind(engines(PREFILL_ENGINES, n_prefill, "prefill", producer),
                        engines(DECODE_ENGINES, n_decode, "decode", both), model, settings,
                        chat_template=kwargs.get("chat_template"))


def run_fleet(args: argparse.Namespace) -> int:
    """``execstate serve MODEL --ray --replicas N``: a local Ray cluster (or the one at
    ``--ray-address``), the fleet on ``--host``/``--port`` (Ray Serve's HTTP proxy), until
    interrupted. The replicas' CPU share is sized to the cluster, or the count refused (exit status
    2: ``cluster_plan.py``); the application is deployed without waiting on it, so a replica that
    dies while the fleet deploys never ends the process or its ingress: :func:`watch_fleet` prints
    the ready line once the application runs and redeploys it when Serve gives up on it."""
    import ray

    pd = getattr(args, "pd", None)
    n = args.replicas if pd is None else sum(pd)
    if args.ray_address is not None:
        ray.init(address=args.ray_address, include_dashboard=False, ignore_reinit_error=True)
        cpus = float(ray.cluster_resources().get("CPU", 0))
    else:
        cpus = float(os.cpu_count() or 2)
    try:
        share = replica_cpus(n, cpus)
    except FleetPlanError as e:
        print(f"execstate serve --ray --replicas {n}: {e}", file=sys.stderr)
        if ray.is_initialized():
            ray.shutdown()
        return 2
    if args.ray_address is None:  # loopback only unless --replica-host says otherwise (cli: keep_local)
        ray.init(num_cpus=int(cpus), include_dashboard=False, ignore_reinit_error=True)
    serve.start(http_options={"host": args.host, "port": args.port})
    kwargs = {"block_size": args.block_size, "seed": args.seed, "enable_return_routed_experts":
              args.enable_return_routed_experts, "max_model_len": args.max_model_len, "dtype": args.dtype,
              "kernels": args.kernels, "chat_template": getattr(args, "chat_template", None),
              "max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens}
    settings = fleet_session_settings(args)
    app = fleet_app(str(args.model), args.replicas, args.served_model_name, kwargs,
                    shared_tier=args.offload_redis_url, sessions=settings,
                    realtime_grace_s=args.realtime_grace_s, pd=pd, replica_host=args.replica_host,
                    replica_resources=args.replica_resources, replica_cpus=share, limits=limits_from_args(args))
    shape = f"{args.replicas} replicas" if pd is None else f"{pd[0]} prefill + {pd[1]} decode replicas"
    ready = (f"execstate fleet: {shape} of {args.model} on http://{args.host}:{args.port} ({share:g} CPU each; "
             "Ray Serve; /v1/fleet/replicas lists them)")
    try:
        watch_fleet(app, ready)
    except KeyboardInterrupt:
        serve.shutdown()
        ray.shutdown()
    return 0


def fleet_session_settings(args: argparse.Namespace) -> SessionSettings:
    """The session settings ``execstate serve --ray`` gives every replica and the ingress, from its
    options: ``--session-hibernate-after``, ``--session-copy-every``, ``--api-keys-file``,
    ``--shared-prefix-group``, ``--session-idle-ttl`` and the ``--tenant-max-*`` quotas (as on one
    server), and ``--fleet-operator``."""
    return SessionSettings(args.session_hibernate_after, args.session_copy_every or None, args.api_keys_file,
                           tuple(getattr(args, "shared_prefix_group", None) or ()), args.session_idle_ttl,
                           quotas_from_args(args), tuple(getattr(args, "fleet_operator", None) or ()))


def watch_fleet(app: Application, ready: str, poll_s: float = 1.0, max_backoff_s: float = 60.0) -> None:
    """Deploy ``app`` without waiting on it, then watch it until interrupted: print ``ready`` once it
    runs; log each change of its status (with Serve's message); redeploy it when Serve marks it
    ``DEPLOY_FAILED`` (a replica that died while deploying: Serve stops retrying), backing off
    from ``poll_s`` to ``max_backoff_s``. Never raises for the application's state: the ingress and
    the replicas that run keep serving whatever happens to the others."""
    serve._run(app, _blocking=False, name=APP_NAME, route_prefix="/")
    announced, last, backoff = False, None, 5.0
    retry_at = None
    while True:
        status = serve.status().applications.get(APP_NAME)
        state = str(getattr(status.status, "value", status.status)) if status is not None else "NOT_STARTED"
        if state != last:
            message = (status.message if status is not None else "") or ""
            log = logger.warning if state in ("DEPLOY_FAILED", "UNHEALTHY") else logger.info
            log("the fleet's application is %s%s", state, f": {message[:500]}" if message else "")
            last = state
        if state == "RUNNING":
            backoff, retry_at = 5.0, None
            if not announced:
                print(ready, flush=True)
                announced = True
        elif state == "DEPLOY_FAILED":
            now = time.monotonic()
            if retry_at is None:
                retry_at = now + backoff
            elif now >= retry_at:
                logger.warning("redeploying the fleet's application (the ingress kept serving meanwhile)")
                serve._run(app, _blocking=False, name=APP_NAME, route_prefix="/")
                backoff, retry_at = min(backoff * 2, max_backoff_s), None
        time.sleep(poll_s)

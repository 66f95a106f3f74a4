"""The fleet's Ray Serve ``RequestRouter``: Ray's replica list, the router core's ranking.

:class:`ExecstateRequestRouter` runs inside each caller of the engine deployment's handle (the
ingress). For every request, ``choose_replicas(candidate_replicas, pending_request)``:

1. reads each candidate's routing stats (``EngineReplica.record_routing_stats``: its KV events
   endpoints, provenance, block size, load) and follows the events of any replica not followed yet
   (:class:`~execstate.fleet.router.subscriber.EventSubscriber`: live + replay);
2. takes the request's :class:`~execstate.fleet.router.policy.RouteRequest` (the first positional
   argument of every fleet call) and asks :class:`~execstate.fleet.router.policy.FleetRouter` for
   the ranking (session affinity, execution-compatible prefix minus load, power of two);
3. returns it as Ray's ranks of ``RunningReplica``s (Ray tries rank 0 first, then the next ...).

The load used is the larger of Ray's cached queue length for the replica (requests this handle
has in flight there) and the replica's own count (running + waiting in its engine, from its last
stats). ``request_router_kwargs`` are :class:`~execstate.fleet.router.policy.RouterKnobs` fields
plus ``policy``: ``"execstate"`` (the default), or the baselines of ``execstate bench cluster``:
``"round_robin"``, ``"power_of_two"``, ``"text_prefix"`` (``fleet/baselines.py``).
"""

from __future__ import annotations

import logging
import random
from typing import Any

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from execstate.fleet.baselines import RoundRobin, TextPrefixAffinity
from execstate.fleet.router.policy import FleetRouter, ReplicaView, RouteRequest, RouterKnobs, eligible
from execstate.fleet.router.subscriber import EventSubscriber
from execstate.identity.provenance import Provenance

logger = logging.getLogger("execstate.fleet")
POLICIES = ("execstate", "power_of_two", "round_robin", "text_prefix")


def route_of(pending: PendingRequest | None) -> RouteRequest:
    if pending is not None:
        for arg in pending.args:
            if isinstance(arg, RouteRequest):
                return arg
    return RouteRequest()


class ExecstateRequestRouter(RequestRouter):
    def initialize_state(self, policy: str = "execstate", seed: int | None = None, **knobs: Any) -> None:
        if policy not in POLICIES:
            raise ValueError(f"fleet router policy must be one of {POLICIES}, got {policy!r}")
        self.policy = policy
        self.core = FleetRouter(RouterKnobs(**knobs), random.Random(seed))
        self.round_robin = RoundRobin()
        self.text_prefix = TextPrefixAffinity(random.Random(seed))
        self.subscriber = EventSubscriber() if policy == "execstate" else None
        self.decisions: dict[str, int] = {}  # reason -> count (logs, metrics)

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if pending_request is not None:
            # Ray retries a choice it could not fulfil (the replica's queue is full, or its queue
            # length probe is still in flight) at once, without yielding the loop, unless the
            # router asks for its backoff (its own routers do, in their locality helpers): without
            # it a choice of one replica (a session's, a version's) spins the router's loop, and the
            # probe's answer, which that loop would receive, never arrives.
            pending_request.routing_context.should_backoff = True
        if not candidate_replicas:
            return []
        route = route_of(pending_request)
        by_id = {r.replica_id.to_full_id_str(): r for r in candidate_replicas}
        views = [self._view(rid, r) for rid, r in by_id.items()]
        if route.session_replica is None and self.policy != "execstate":
            ranks = self._baseline(route, views)
        elif self.subscriber is not None:
            with self.subscriber.locked():  # the subscriber's thread applies batches under this lock
                decision = self.core.rank(route, views)
            self.decisions[decision.reason] = self.decisions.get(decision.reason, 0) + 1
            ranks = decision.ranks
        else:
            decision = self.core.rank(route, views)
            self.decisions[decision.reason] = self.decisions.get(decision.reason, 0) + 1
            ranks = decision.ranks
        return [[by_id[rid] for rid in rank if rid in by_id] for rank in ranks]

    def _baseline(self, route: RouteRequest, views: list[ReplicaView]) -> list[list[str]]:
        views = eligible(route, views)
        if self.policy == "round_robin":
            return self.round_robin.rank(views)
        if self.policy == "text_prefix":
            return self.text_prefix.rank(route.token_ids, views)
        return self.core.power_of_two(views)

    def _view(self, rid: str, replica: RunningReplica) -> ReplicaView:
        stats = replica.routing_stats or {}
        cached = self._replica_queue_len_cache.get(replica.replica_id) or 0
        queue = max(int(stats.get("queue_len", 0)), int(cached))
        prov = None
        if "provenance" in stats:
            try:
                prov = Provenance(**stats["provenance"])
            except (TypeError, ValueError):
                logger.warning("replica %s reported an unreadable provenance", rid)
        index = None
        if self.subscriber is not None and stats.get("kv_events"):
            self.subscriber.watch(rid, stats["kv_events"], stats.get("kv_replay"))
            index = self.subscriber.index(rid)
        return ReplicaView(rid, queue, float(stats.get("kv_usage", 0.0)), prov, int(stats.get("block_size", 16)),
                           index)

    def on_replica_actor_died(self, replica_id: Any) -> None:
        super().on_replica_actor_died(replica_id)
        if self.subscriber is not None:
            self.subscriber.unwatch(replica_id.to_full_id_str())

"""The routing policy: execution-compatible prefix, load, session affinity (docs/fleet.md).

:meth:`FleetRouter.rank` orders the candidate replicas for one request, best first, as ranks (a
list of lists, the shape Ray Serve's ``RequestRouter.choose_replicas`` returns: the caller tries
rank 0's replicas, then rank 1's, ...):

1. **Session affinity**: a request of a live session (``RouteRequest.session_replica``) goes to
   the replica that holds the session, and only there (one rank of one replica), draining or not
   (a draining replica serves its sessions until they moved). When that
   replica is not a candidate (gone, draining), the request is ranked like any other and the
   replica that gets it answers that it does not hold the session (the ingress says so).
   Other requests never go to a replica in ``RouteRequest.exclude`` (draining), unless no other
   is left. A request bound to weights versions (``RouteRequest.weights_versions``: the decode
   half of a PD pair runs the version its prefill ran, ``pd_pairing.py``) goes only to replicas
   whose provenance names one of them; when none does, every candidate is ranked and the replica
   refuses the version it does not run (the fleet never serves a pair of two versions).
2. **Execution-compatible prefix**: per replica, ``hit`` = the longest run of the request's
   block keys (``prompt_keys.request_keys`` under *that replica's* provenance and the request's
   cache scope: tenant or shared group, and salt) found in its index, each block weighted by
   the best medium that holds it (``tier_weights``: a block in the pool saves more than one on
   disk). Keys of another weights version, numerics, tenant or salt differ, so they are never counted. ``score = hit -
   queue_weight * queue_len - kv_weight * kv_usage`` (in blocks; ``queue_len``: requests queued
   or running there; ``kv_usage``: the pool's used fraction).
   Replicas are ranked by score when some replica's ``hit`` reaches ``min_hit_blocks``.
3. Otherwise, or when the best-scoring replica's queue exceeds the least-loaded replica's by more
   than ``max_imbalance`` requests, the prefix is ignored:
   **power of two choices** (two random candidates, the less loaded first, then the rest by load).

Pure Python and deterministic given ``rng``. Knobs are :class:`RouterKnobs` (documented there and
in docs/fleet.md). :class:`Decision` records why each request went where (tests, metrics, bench).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from execstate.fleet.router.block_index import ReplicaIndex
from execstate.fleet.router.prompt_keys import request_keys
from execstate.identity.provenance import Provenance
from execstate.identity.scope import LOCAL_SCOPE, CacheScope

DEFAULT_TIER_WEIGHTS = {"pool": 1.0, "dram": 0.8, "disk": 0.5, "shared": 0.25}


@dataclass(frozen=True)
class RouterKnobs:
    """``min_hit_blocks``: the least weighted hit (in blocks) that counts as a useful prefix;
    ``queue_weight``: blocks of hit one queued request is worth; ``kv_weight``: blocks of hit a
    full pool is worth; ``max_imbalance``: the most requests the prefix-chosen replica may have
    queued beyond the least-loaded one; ``tier_weights``: what a block in each medium is worth;
    ``max_blocks``: the longest prefix looked at (bounds the hashing per request)."""

    min_hit_blocks: float = 1.0
    queue_weight: float = 2.0
    kv_weight: float = 4.0
    max_imbalance: int = 8
    tier_weights: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_TIER_WEIGHTS))
    max_blocks: int = 512

    def __post_init__(self) -> None:
        for name in ("min_hit_blocks", "queue_weight", "kv_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"router knob {name} must be >= 0, got {getattr(self, name)}")
        if self.max_imbalance < 0 or self.max_blocks < 1:
            raise ValueError("router knobs max_imbalance must be >= 0 and max_blocks >= 1")


@dataclass(frozen=True)
class ReplicaView:
    """What the router knows of one candidate replica. ``provenance`` None: not known yet (its
    prefix scores 0); ``index`` None: no events from it yet."""

    replica_id: str
    queue_len: int = 0
    kv_usage: float = 0.0
    provenance: Provenance | None = None
    block_size: int = 16
    index: ReplicaIndex | None = None

    @property
    def load(self) -> float:
        return self.queue_len + self.kv_usage


@dataclass(frozen=True)
class RouteRequest:
    """The routing-relevant part of a request: its prompt's token ids (None: not a prompt, e.g. a
    session call), its cache scope (the caller's tenant or shared group and salt), the replica
    holding its live session (None: none; the fleet
    also uses it to address one replica), replicas taken out of service (``exclude``: draining;
    never chosen unless every candidate is excluded), the weights versions that may serve it
    (``weights_versions``; None: any; the router prefers replicas whose routing stats report one),
    and the one version the replica must run to answer (``require_version``; None: any): checked by
    the replica only (it refuses with 409 ``weights_version_mismatch``), never by the router, whose
    view of a replica's version is only as fresh as its routing stats."""

    token_ids: Sequence[int] | None = None
    scope: CacheScope = LOCAL_SCOPE
    session_replica: str | None = None
    exclude: tuple[str, ...] = ()
    weights_versions: tuple[str, ...] | None = None
    require_version: str | None = None


@dataclass(frozen=True)
class Decision:
    ranks: list[list[str]]
    reason: str  # "session" | "prefix" | "power_of_two" | "none"
    hits: dict[str, float]  # weighted hit (blocks) per replica scored


def eligible(request: RouteRequest, replicas: Sequence[ReplicaView]) -> list[ReplicaView]:
    """The candidates a request may go to: not excluded (unless all are), and of one of its weights
    versions (unless none is: the replica then refuses the request itself)."""
    out = list(replicas)
    if request.exclude:
        out = [r for r in out if r.replica_id not in request.exclude] or out
    if request.weights_versions is not None:
        out = [r for r in out if r.provenance is not None
               and r.provenance.weights_version in request.weights_versions] or out
    return out


class FleetRouter:
    def __init__(self, knobs: RouterKnobs | None = None, rng: random.Random | None = None) -> None:
        self.knobs = knobs or RouterKnobs()
        self.rng = rng or random.Random()

    def rank(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> Decision:
        if request.session_replica is not None and any(r.replica_id == request.session_replica for r in replicas):
            return Decision([[request.session_replica]], "session", {})
        replicas = eligible(request, replicas)
        if not replicas:
            return Decision([], "none", {})
        hits = self.hits(request, replicas)
        scores = {r.replica_id: hits[r.replica_id] - self.knobs.queue_weight * r.queue_len
                  - self.knobs.kv_weight * r.kv_usage for r in replicas}
        best = max(replicas, key=lambda r: (scores[r.replica_id], -r.load))
        least = min(r.queue_len for r in replicas)
        top_hit = max(hits.values())
        useful = top_hit >= self.knobs.min_hit_blocks and top_hit > 0
        if useful and best.queue_len - least <= self.knobs.max_imbalance:
            order = sorted(replicas, key=lambda r: (-scores[r.replica_id], r.load))
            return Decision([[r.replica_id] for r in order], "prefix", hits)
        return Decision(self.power_of_two(replicas), "power_of_two", hits)

    def hits(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> dict[str, float]:
        """The weighted execution-compatible hit (blocks) of the request on each replica."""
        out = {r.replica_id: 0.0 for r in replicas}
        if not request.token_ids:
            return out
        chains: dict[tuple[Provenance, int], list[bytes]] = {}
        weights = self.knobs.tier_weights
        for r in replicas:
            if r.provenance is None or r.index is None:
                continue
            chain_id = (r.provenance, r.block_size)
            if chain_id not in chains:
                chains[chain_id] = [bytes(k) for k in request_keys(r.provenance, r.block_size, request.token_ids,
                                                                   request.scope, self.knobs.max_blocks)]
            run = r.index.longest_run(chains[chain_id])
            out[r.replica_id] = sum(max((weights.get(m, 0.0) for m in media), default=0.0) for media in run)
        return out

    def power_of_two(self, replicas: Sequence[ReplicaView]) -> list[list[str]]:
        """Two random candidates, the less loaded first; then the others by load."""
        pair = self.rng.sample(list(replicas), min(2, len(replicas)))
        pair.sort(key=lambda r: r.load)
        chosen = {r.replica_id for r in pair}
        rest = sorted((r for r in replicas if r.replica_id not in chosen), key=lambda r: r.load)
        return [[r.replica_id] for r in pair + rest]

"""The PD pairing rule (fleet/router/pd_pairing.py) and the router's version binding (policy.py):
a prefill goes to a version some decode replica runs, the decode to the prefill's version, the
prefix still decides among the replicas of that version, and no route pairs two versions. No Ray."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from execstate.fleet.router.block_index import ReplicaIndex
from execstate.fleet.router.pd_pairing import (
    DECODE,
    PREFILL,
    NoPair,
    VersionDirectory,
    decode_route,
    prefill_route,
)
from execstate.fleet.router.policy import FleetRouter, ReplicaView, RouteRequest, eligible
from execstate.fleet.router.prompt_keys import request_keys
from execstate.identity.provenance import Provenance
from execstate.identity.scope import CacheScope
from execstate.state.kv_events.events import BlockStored, KVEventBatch

BS = 4
PROMPT = list(range(10, 50))  # 40 tokens: 9 blocks that can hit


def prov(version: str) -> Provenance:
    return Provenance("tiny", version, "float32", "eager+torch-cpu")


def cached(version: str, tokens: list[int]) -> ReplicaIndex:
    """The index of a replica of ``version`` holding ``tokens``'s blocks in its pool."""
    keys = [bytes(k) for k in request_keys(prov(version), BS, tokens)]
    idx = ReplicaIndex()
    idx.apply(0, KVEventBatch(0.0, [BlockStored(keys, None, tokens[:len(keys) * BS], BS, weights_version=version)]))
    return idx


def view(rid: str, version: str, tokens: list[int] | None = None, queue: int = 0) -> ReplicaView:
    return ReplicaView(rid, queue, 0.0, prov(version), BS, cached(version, tokens or []))


def directory(**replicas: tuple[str, str | None]) -> VersionDirectory:
    d = VersionDirectory()
    for rid, (role, version) in replicas.items():
        d.record(rid, role, version)
    return d


def test_prefill_may_go_only_to_a_version_a_decode_replica_runs():
    d = directory(p0=(PREFILL, "v0"), p1=(PREFILL, "v1"), d0=(DECODE, "v0"))
    assert d.pair_versions() == ("v0",)
    scope = CacheScope.build("alpha", "salt")
    route = prefill_route(RouteRequest(PROMPT, scope, session_replica="x"), d, {"d9"})
    assert route.weights_versions == ("v0",) and route.exclude == ("d9",)
    assert route.token_ids == PROMPT and route.scope == scope and route.session_replica is None


def test_no_common_version_is_no_pair_and_unknown_versions_leave_it_to_the_replicas():
    with pytest.raises(NoPair, match="prefill: \\['v1'\\], decode: \\['v0'\\]"):
        directory(p0=(PREFILL, "v1"), d0=(DECODE, "v0")).pair_versions()
    assert directory(p0=(PREFILL, "v1"), d0=(DECODE, None)).pair_versions() is None  # registered, version unknown
    assert directory(p0=(PREFILL, "v1")).pair_versions() is None  # no decode replica registered yet
    assert VersionDirectory().pair_versions() is None


def test_excluded_replicas_do_not_pair_unless_all_are_excluded():
    d = directory(p0=(PREFILL, "v0"), p1=(PREFILL, "v1"), d0=(DECODE, "v0"), d1=(DECODE, "v1"))
    assert d.pair_versions() == ("v0", "v1")
    assert d.pair_versions({"d0"}) == ("v1",)  # d0 drains: only v1 has a decode replica
    with pytest.raises(NoPair):
        d.pair_versions({"d0", "p1"})  # p0 (v0) has no decode partner left, d1 (v1) no prefill one
    assert d.pair_versions({"d0", "d1"}) == ("v0", "v1")  # every decode replica drains: all count


def test_a_directory_records_forgets_and_keeps_a_known_version():
    d = directory(p0=(PREFILL, "v0"))
    d.record("p0", PREFILL, None)  # an answer without a version keeps the one known
    assert d.version_of("p0") == "v0" and d.role_of("p0") == PREFILL
    d.record("p0", PREFILL, "v1")
    assert d.version_of("p0") == "v1"
    d.forget("p0")
    assert d.role_of("p0") is None and d.replicas(PREFILL) == []
    with pytest.raises(ValueError, match="role"):
        d.record("x", "engine", "v0")


def test_decode_is_bound_to_the_prefill_version_and_ranked_by_its_own_cached_prefix():
    router = FleetRouter(rng=random.Random(0))
    route = decode_route(RouteRequest(PROMPT), "v1", {"d3"})
    assert route.weights_versions == ("v1",) and route.exclude == ("d3",)
    replicas = [view("d0", "v0", PROMPT),  # the whole prefix, but another version: never chosen
                view("d1", "v1"),  # right version, nothing cached
                view("d2", "v1", PROMPT[:20])]  # right version, 4 blocks of the prefix: less to transfer
    decision = router.rank(route, replicas)
    assert decision.reason == "prefix" and decision.ranks == [["d2"], ["d1"]]
    assert decision.hits == {"d1": 0.0, "d2": 4.0}
    unbound = router.rank(RouteRequest(PROMPT), replicas)  # without the binding, d0's prefix wins
    assert unbound.ranks[0] == ["d0"]


def test_with_no_replica_of_the_version_every_candidate_is_ranked_and_refuses_itself():
    replicas = [view("d0", "v0"), view("d1", "v0")]
    route = decode_route(RouteRequest(PROMPT), "v1")
    assert [r.replica_id for r in eligible(route, replicas)] == ["d0", "d1"]
    assert sorted(r[0] for r in FleetRouter(rng=random.Random(0)).rank(route, replicas).ranks) == ["d0", "d1"]
    unknown = ReplicaView("d2", provenance=None)
    assert [r.replica_id for r in eligible(route, [unknown, view("d3", "v1")])] == ["d3"]


fleets = st.lists(st.tuples(st.sampled_from([PREFILL, DECODE]), st.sampled_from(["v0", "v1", "v2"]),
                            st.booleans(), st.integers(0, 9), st.integers(0, 10)), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(fleets, st.integers(0, 2**16))
def test_a_pair_is_never_two_versions(fleet, seed):
    """Whatever the fleet (roles, versions, draining, load, cached prefix), the pairing rule plus the
    replicas' own refusal (a replica serves only a version it runs) either pairs one version or
    finds no pair, and finds a pair whenever one exists outside the drained replicas."""
    d = VersionDirectory()
    views: dict[str, list[ReplicaView]] = {PREFILL: [], DECODE: []}
    draining = set()
    for i, (role, version, drains, queue, hit_blocks) in enumerate(fleet):
        rid = f"{role}{i}"
        d.record(rid, role, version)
        views[role].append(view(rid, version, PROMPT[:hit_blocks * BS + 1], queue))
        if drains:
            draining.add(rid)
    router = FleetRouter(rng=random.Random(seed))

    def serve(role: str, route: RouteRequest) -> ReplicaView | None:
        """Ray tries the ranks in order; a replica refuses a version it does not run."""
        by_id = {v.replica_id: v for v in views[role]}
        for rank in router.rank(route, views[role]).ranks:
            got = by_id[rank[0]]
            if route.weights_versions is None or got.provenance.weights_version in route.weights_versions:
                return got
        return None

    def live(role: str) -> set[str]:
        kept = [v for v in views[role] if v.replica_id not in draining] or views[role]
        return {v.provenance.weights_version for v in kept}

    common = live(PREFILL) & live(DECODE)
    try:
        p_route = prefill_route(RouteRequest(PROMPT), d, draining)
    except NoPair:
        assert not common and views[PREFILL] and views[DECODE]
        return
    p = serve(PREFILL, p_route)
    if not views[PREFILL] or not views[DECODE]:
        assert p_route.weights_versions is None
        return
    assert p is not None and p.provenance.weights_version in common
    dec = serve(DECODE, decode_route(RouteRequest(PROMPT), p.provenance.weights_version, draining))
    assert dec is not None and dec.provenance.weights_version == p.provenance.weights_version

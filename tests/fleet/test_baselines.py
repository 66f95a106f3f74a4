"""The baseline routers of the fleet benchmark (fleet/baselines.py): round-robin, and Ray's
PrefixCacheAffinityRouter algorithm (token prefix, no execution state)."""

from __future__ import annotations

import random

from execstate.fleet.baselines import RoundRobin, TextPrefixAffinity
from execstate.fleet.router.policy import ReplicaView


def test_round_robin_turns():
    rr, views = RoundRobin(), [ReplicaView("b"), ReplicaView("a"), ReplicaView("c")]
    assert [rr.rank(views)[0][0] for _ in range(4)] == ["a", "b", "c", "a"]
    assert rr.rank([]) == []


def test_text_prefix_affinity_follows_prefixes_and_ignores_execution_state():
    tp = TextPrefixAffinity(random.Random(0))
    views = [ReplicaView("a"), ReplicaView("b")]
    system = list(range(100, 140))
    first = tp.rank(system + [1, 2], views)[0][0]
    other = "b" if first == "a" else "a"
    # below the 10 % match threshold: the replica sent the fewest tokens
    assert tp.rank(list(range(600, 640)), views)[0][0] == other
    for i in range(5):  # the shared prefix sticks to the replica that saw it
        assert tp.rank(system + [i + 3], views)[0][0] == first
    # no notion of versions or salts: a replica on other weights still "matches"
    stale = [ReplicaView(first, queue_len=0), ReplicaView(other, queue_len=0)]
    assert tp.rank(system + [9], stale)[0][0] == first


def test_text_prefix_affinity_falls_back_to_power_of_two_when_imbalanced():
    tp = TextPrefixAffinity(random.Random(0), imbalanced_threshold=2)
    system = list(range(100, 140))
    tp.remember("a", system)
    views = [ReplicaView("a", queue_len=5), ReplicaView("b", queue_len=0)]
    assert tp.rank(system + [1], views)[0][0] == "b"

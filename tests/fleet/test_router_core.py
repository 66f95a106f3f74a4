"""The router core (fleet/router/): indexes rebuilt from recorded KV event streams of real engines,
scoring by execution-compatible prefix (another weights version or salt scores 0), load, session
affinity and the power-of-two fallback. No Ray."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kv_events_client import replay_all

from execstate import LLM
from execstate.engine.sampling_params import SamplingParams
from execstate.fleet.router.block_index import ReplicaIndex, SequenceGap
from execstate.fleet.router.policy import FleetRouter, ReplicaView, RouteRequest, RouterKnobs
from execstate.fleet.router.prompt_keys import request_keys
from execstate.fleet.router.subscriber import EventSubscriber
from execstate.identity.scope import CacheScope
from execstate.model.random_models import make_random
from execstate.state.kv_events.config import KVEventsConfig
from execstate.state.kv_events.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, decode_batch

BS = 4
GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
EVENTS = KVEventsConfig(enable_kv_cache_events=True, endpoint="tcp://127.0.0.1:0",
                        replay_endpoint="tcp://127.0.0.1:0")


def prompt(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 500, n).tolist()


SYSTEM_A, SYSTEM_B = prompt(100, 32), prompt(200, 32)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_random("qwen3_moe", tmp_path_factory.mktemp("fleet_moe"), seed=0)


def record(llm: LLM) -> list[tuple[int, KVEventBatch]]:
    """The engine's whole stream so far, from its replay socket (what a late subscriber gets)."""
    llm.engine.kv_events.flush()
    assert llm.engine.kv_events.publisher.wait_sent()
    return [(s, decode_batch(p)) for s, p in replay_all(llm.engine.kv_events.replay_endpoint)]


@pytest.fixture(scope="module")
def replicas(model_dir):
    """Two engines that served different system prompts; their streams and their provenances."""
    out = {}
    for name, system in (("a", SYSTEM_A), ("b", SYSTEM_B)):
        llm = LLM(str(model_dir), block_size=BS, max_model_len=64, num_kv_blocks=64, kv_events=EVENTS)
        for i in range(2):
            llm.generate({"prompt_token_ids": system + prompt(i, 6)}, GREEDY, use_tqdm=False)
        out[name] = (record(llm), llm.engine.provenance, pool_keys(llm))
        llm.engine.kv_events.close()
    return out


def pool_keys(llm: LLM) -> set[bytes]:
    pool = llm.engine.block_pool
    return {bytes(k) for k in (pool.key_of(b) for b in range(pool.num_blocks)) if k is not None}


def index_of(stream) -> ReplicaIndex:
    idx = ReplicaIndex()
    for seq, batch in stream:
        idx.apply(seq, batch)
    return idx


def views(replicas, **over) -> list[ReplicaView]:
    out = []
    for name, (stream, prov, _) in sorted(replicas.items()):
        kw = dict(replica_id=name, provenance=prov, block_size=BS, index=index_of(stream))
        kw.update(over.get(name, {}))
        out.append(ReplicaView(**kw))
    return out


def test_recorded_stream_rebuilds_each_replica_exactly(replicas):
    for stream, _, truth in replicas.values():
        assert index_of(stream).keys("pool") == truth and len(truth) >= 8


def test_prefix_goes_to_the_replica_holding_it(replicas):
    router = FleetRouter(rng=random.Random(0))
    for system, want in ((SYSTEM_A, "a"), (SYSTEM_B, "b")):
        d = router.rank(RouteRequest(system + prompt(99, 9)), views(replicas))
        assert d.reason == "prefix" and d.ranks[0] == [want]
        assert d.hits[want] == 8.0  # the 32-token system prompt: 8 blocks of 4, all in the pool
        assert d.hits["b" if want == "a" else "a"] == 0.0


def test_another_weights_version_or_salt_scores_zero(replicas):
    router = FleetRouter(rng=random.Random(0))
    _, prov_a, _ = replicas["a"]
    stale = views(replicas, a={"provenance": prov_a.replace(weights_version="user:v2")})
    d = router.rank(RouteRequest(SYSTEM_A + prompt(99, 9)), stale)
    assert d.hits == {"a": 0.0, "b": 0.0} and d.reason == "power_of_two"
    for scope in (CacheScope.build("local", "tenant-1"), CacheScope.build("another-tenant")):
        d = router.rank(RouteRequest(SYSTEM_A + prompt(99, 9), scope), views(replicas))
        assert d.hits == {"a": 0.0, "b": 0.0}
        # the keys differ, not the comparison: the other scope's chain shares no key with the index
        other = request_keys(prov_a, BS, SYSTEM_A + [7], scope)
        assert not set(other) & index_of(replicas["a"][0]).keys("pool")


def test_load_outweighs_a_short_prefix_and_imbalance_disables_it(replicas):
    router = FleetRouter(RouterKnobs(queue_weight=2.0), rng=random.Random(0))
    req = RouteRequest(SYSTEM_A[:12] + prompt(5, 5))  # 3 blocks cached on a
    d = router.rank(req, views(replicas, a={"queue_len": 3}))
    assert d.reason == "prefix" and d.ranks[0] == ["b"]  # 3 - 2*3 < 0 - 0
    light = FleetRouter(RouterKnobs(queue_weight=0.5), rng=random.Random(0))
    d = light.rank(RouteRequest(SYSTEM_A + [1, 2]), views(replicas, a={"queue_len": 8}))
    assert d.reason == "prefix" and d.ranks[0] == ["a"]  # 8 - 0.5*8 > 0, 8 queued beyond b: allowed
    d = light.rank(RouteRequest(SYSTEM_A + [1, 2]), views(replicas, a={"queue_len": 9}))
    assert d.reason == "power_of_two"  # 9 queued beyond b's 0 > max_imbalance 8


def test_session_affinity_and_power_of_two(replicas):
    router = FleetRouter(rng=random.Random(1))
    d = router.rank(RouteRequest(SYSTEM_A + [1, 2], session_replica="b"), views(replicas))
    assert (d.ranks, d.reason) == ([["b"]], "session")
    d = router.rank(RouteRequest(SYSTEM_A, session_replica="gone"), views(replicas))
    assert d.reason == "prefix" and d.ranks[0] == ["a"]
    many = [ReplicaView(f"r{i}", queue_len=i) for i in range(5)]
    for _ in range(20):
        d = router.rank(RouteRequest(prompt(7, 20)), many)
        assert d.reason == "power_of_two" and sorted(sum(d.ranks, [])) == [f"r{i}" for i in range(5)]
        first, second = int(d.ranks[0][0][1]), int(d.ranks[1][0][1])
        assert first < second  # the pair, less loaded first
    assert router.rank(RouteRequest(None), []).ranks == []


def test_tier_weights():
    idx = ReplicaIndex()
    prov = LLMProv.get()
    keys = [bytes(k) for k in request_keys(prov, BS, list(range(3, 3 + 4 * 6 + 1)))]
    idx.apply(0, KVEventBatch(0.0, [AllBlocksCleared(),
                                    BlockStored(keys[:2], None, list(range(8)), BS, None, "pool", "w"),
                                    BlockStored(keys[2:4], keys[1], list(range(8)), BS, None, "disk", "w")]))
    view = ReplicaView("x", provenance=prov, block_size=BS, index=idx)
    hits = FleetRouter().hits(RouteRequest(list(range(3, 3 + 4 * 6 + 1))), [view])
    assert hits == {"x": 2 * 1.0 + 2 * 0.5}
    idx.apply(1, KVEventBatch(0.0, [BlockRemoved(keys[:1], "pool")]))
    assert FleetRouter().hits(RouteRequest(list(range(3, 3 + 25))), [view]) == {"x": 0.0}


class LLMProv:
    @staticmethod
    def get():
        from execstate.identity.provenance import Provenance

        return Provenance("m", "w", "float32", "eager+torch-cpu")


def test_index_refuses_gaps_and_resets():
    idx = ReplicaIndex()
    idx.apply(0, KVEventBatch(0.0, [BlockStored([b"k" * 32], None, [1, 2, 3, 4], BS)]))
    with pytest.raises(SequenceGap):
        idx.apply(2, KVEventBatch(0.0, []))
    assert idx.keys() == {b"k" * 32} and idx.next_seq == 1
    idx.reset(5)
    assert idx.keys() == set() and idx.next_seq == 5


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["store", "remove", "clear"]), st.sampled_from(["pool", "disk"]),
                          st.lists(st.integers(0, 9), max_size=4)), max_size=30))
def test_index_matches_a_model_of_sets(ops):
    idx, model = ReplicaIndex(), {"pool": set(), "disk": set()}
    for seq, (op, medium, ks) in enumerate(ops):
        keys = [bytes([k]) * 32 for k in ks]
        if op == "store":
            ev, _ = BlockStored(keys, None, [0] * (BS * len(keys)), BS, None, medium), model[medium].update(keys)
        elif op == "remove":
            ev, _ = BlockRemoved(keys, medium), model[medium].difference_update(keys)
        else:
            ev, _ = AllBlocksCleared(), [m.clear() for m in model.values()]
        idx.apply(seq, KVEventBatch(0.0, [ev]))
        assert idx.keys("pool") == model["pool"] and idx.keys("disk") == model["disk"]
        assert idx.count("pool") == len(model["pool"])


def test_subscriber_follows_a_live_engine_and_catches_up(model_dir):
    llm = LLM(str(model_dir), block_size=BS, max_model_len=64, num_kv_blocks=20, kv_events=EVENTS)
    sub = EventSubscriber()
    try:
        llm.generate({"prompt_token_ids": prompt(1, 30)}, GREEDY, use_tqdm=False)  # before watching: replayed
        llm.engine.kv_events.flush()
        sub.watch("r0", llm.engine.kv_events.endpoint, llm.engine.kv_events.replay_endpoint)
        time.sleep(0.3)
        for i in range(5):  # 20 blocks: evictions
            llm.generate({"prompt_token_ids": prompt(10 + i, 30)}, GREEDY, use_tqdm=False)
        llm.engine.kv_events.flush()
        truth = pool_keys(llm)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # the publisher thread sends the last batches meanwhile
            with sub.locked():
                if sub.index("r0").keys("pool") == truth:
                    break
            time.sleep(0.05)
        sub.catch_up("r0")
        with sub.locked():
            assert sub.index("r0").keys("pool") == truth
            assert sub.index("r0").next_seq == llm.engine.kv_events.publisher.next_seq
        sub.unwatch("r0")
        assert sub.watching() == []
    finally:
        sub.close()
        llm.engine.kv_events.close()


def test_excluded_replicas_are_never_chosen_unless_alone(replicas):
    router = FleetRouter(rng=random.Random(0))
    d = router.rank(RouteRequest(SYSTEM_A + [1, 2], exclude=("a",)), views(replicas))
    assert sum(d.ranks, []) == ["b"]
    d = router.rank(RouteRequest(SYSTEM_A + [1, 2], exclude=("a", "b")), views(replicas))
    assert d.ranks[0] == ["a"]
    d = router.rank(RouteRequest(session_replica="a", exclude=("a",)), views(replicas))
    assert d.ranks == [["a"]]  # a draining replica still serves its sessions until they moved

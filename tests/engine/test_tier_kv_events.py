"""KV events of the offload tiers (state/kv_events/recorder.py, state/tiers/unit_events.py): a plain ZeroMQ
client (tests/kv_events_client.py) rebuilds one engine's index of the pool, DRAM, disk and Redis
tiers from its batches under evictions, write-backs, drops, reloads and a restart, and finds
exactly what each tier holds; every tier event names its unit's chain and weights version; the
router core counts tier blocks by their tier weight and never a unit of another weights version."""

from __future__ import annotations

import time

import pytest
from kv_events_client import MediaIndex, replay_all
from offload_helpers import BS, churn, keys_of, make, prompt, run

from execstate.fleet.router.block_index import ReplicaIndex
from execstate.fleet.router.policy import DEFAULT_TIER_WEIGHTS, FleetRouter, ReplicaView, RouteRequest
from execstate.identity.keys import block_key
from execstate.model.loader import load_hf_state_dict
from execstate.state.kv_events.config import KVEventsConfig
from execstate.state.kv_events.events import BlockStored, decode_batch

EVENTS = KVEventsConfig(enable_kv_cache_events=True, endpoint="tcp://127.0.0.1:0", include_token_ids=True,
                        replay_endpoint="tcp://127.0.0.1:0")
MEDIA = ("pool", "dram", "disk", "shared")


def blob_bytes(moe_dir) -> int:
    """An upper bound of one unit's blob (KV + routes + record) for the tiny MoE."""
    probe = make(moe_dir, offload_dram_bytes=1 << 20)
    unit = probe.engine.offload.unit_nbytes
    probe.engine.offload.close()
    return unit + 2048


def tiered(moe_dir, tmp_path, redis_url, blob: int, *, dram: int = 8, disk: int = 12, shared: int = 20):
    return make(moe_dir, kv_events=EVENTS, offload_dram_bytes=dram * (blob - 2048),
                offload_disk_dir=str(tmp_path / "d"), offload_disk_bytes=disk * blob,
                offload_redis_url=redis_url, offload_redis_bytes=shared * blob, offload_timeout_s=30.0,
                offload_secret="tier-events-shared-secret-0123456789")


def truth(llm) -> dict[str, set[bytes]]:
    """What each tier would answer a lookup for now."""
    eng, off = llm.engine, llm.engine.offload
    pool = eng.block_pool
    return {
        "pool": {bytes(k) for k in (pool.key_of(b) for b in range(pool.num_blocks)) if k is not None},
        "dram": {bytes(k) for k in off.host.list_keys()},
        "disk": {bytes(k) for k in off.stores[0].index.list_keys()},
        "shared": {bytes(k) for k in off.redis.index.list_keys()},
    }


def settle(llm) -> None:
    """Let the write-backs finish and the publisher send what they reported. No ``flush`` of the
    events by the test: the write-back thread publishes its tiers' events itself."""
    assert llm.engine.offload.flush()
    time.sleep(0.15)  # the write-back thread reports its tiers' events once its queue is empty
    assert llm.engine.kv_events.publisher.wait_sent()


def follow(index: MediaIndex, llm) -> None:
    settle(llm)
    index.follow(llm.engine.kv_events.replay_endpoint)


def check_exact(index: MediaIndex, llm) -> dict[str, set[bytes]]:
    want = truth(llm)
    for medium in MEDIA:
        assert index.medium(medium) == want[medium], f"{medium}: index and tier differ"
    return want


def check_records(index: MediaIndex, version: str) -> int:
    """Every tier key's stored event is its unit: key = H(parent, tokens), the weights version."""
    n = 0
    for (medium, key), ev in index.stored.items():
        if medium == "pool":
            continue
        assert isinstance(ev, BlockStored) and len(ev.token_ids) == BS
        assert block_key(ev.parent_block_hash, ev.token_ids) == key
        assert ev.weights_version == version, f"{medium} unit of version {ev.weights_version}"
        n += 1
    return n


def test_subscriber_rebuilds_pool_dram_disk_and_shared_exactly(moe_dir, tmp_path, redis_server):
    blob = blob_bytes(moe_dir)
    llm = tiered(moe_dir, tmp_path, redis_server.url, blob, dram=8, disk=10, shared=14)
    version = llm.engine.provenance.weights_version
    index = MediaIndex()
    first = prompt(1)
    run(llm, first)
    churn(llm, keys_of(llm, first), first_seed=100)  # evictions: write-backs to all three tiers
    for seed in range(200, 212):  # more than the tiers hold: DRAM, disk and Redis drop their oldest
        run(llm, prompt(seed))
    follow(index, llm)
    want = check_exact(index, llm)
    assert len(want["dram"]) == 8 and len(want["disk"]) >= 10 and len(want["shared"]) >= 14  # full
    assert all(index.num_removed.get(m, 0) > 0 for m in MEDIA), index.num_removed
    assert check_records(index, version) == len(want["dram"]) + len(want["disk"]) + len(want["shared"])

    # a reload: a prompt whose units the tiers still hold comes back from them, then churns out again
    tiers = want["dram"] | want["disk"] | want["shared"]
    # the prompt evicted last: its units are the tiers' newest, so the write-backs its own
    # admission causes (tiers full: each drops its oldest) do not drop them before the reload reads them
    def reloads(seed: int) -> bool:
        """Its prefix is reachable (blocks in the pool, then one a tier holds): a reload."""
        for k in (bytes(k) for k in keys_of(llm, prompt(seed))):
            if k not in want["pool"]:
                return k in tiers
        return False

    # which prompts' units survived depends on when the write-back thread ran: search them all
    back = next(seed for seed in [*range(211, 199, -1), *range(199, 99, -1), 1] if reloads(seed))
    out = run(llm, prompt(back))
    assert out.prompt_token_sources["offloaded"] > 0, (out.prompt_token_sources, [
        [m for m in MEDIA if bytes(k) in want[m]] for k in keys_of(llm, prompt(back))], llm.engine.offload.snapshot())
    follow(index, llm)
    check_exact(index, llm)
    for seed in range(300, 306):
        run(llm, prompt(seed))
    follow(index, llm)
    check_exact(index, llm)
    check_records(index, version)

    # a restart on the same disk directory: batch 0 clears, then the units found on disk
    disk_before = truth(llm)["disk"]
    llm.engine.offload.close()
    llm.engine.kv_events.close()
    again = tiered(moe_dir, tmp_path, redis_server.url, blob)
    restarted = MediaIndex()
    follow(restarted, again)
    assert restarted.medium("disk") == disk_before == truth(again)["disk"]
    assert restarted.medium("dram") == restarted.medium("shared") == restarted.medium("pool") == set()
    assert check_records(restarted, version) == len(disk_before)
    again.engine.offload.close()
    again.engine.kv_events.close()


def test_router_counts_tier_blocks_by_weight_and_never_another_version(moe_dir, moe_dir_other_weights, tmp_path,
                                                                         redis_server):
    blob = blob_bytes(moe_dir)
    llm = tiered(moe_dir, tmp_path, redis_server.url, blob, dram=40, disk=8, shared=40)
    old = llm.engine.provenance
    ids = prompt(7, 100)
    keys = keys_of(llm, ids)
    run(llm, ids)
    churn(llm, keys, first_seed=400)  # its blocks: out of the pool, in the tiers
    settle(llm)
    router_index = ReplicaIndex()
    for seq, payload in replay_all(llm.engine.kv_events.replay_endpoint, 0):
        router_index.apply(seq, decode_batch(payload))
    want = truth(llm)
    assert not any(bytes(k) in want["pool"] for k in keys)
    expected = 0.0
    for k in keys:  # the longest run of the prompt's keys held somewhere, each at its best tier's weight
        media = [m for m in MEDIA if bytes(k) in want[m]]
        if not media:
            break
        expected += max(DEFAULT_TIER_WEIGHTS[m] for m in media)
    # (a write-back finding every DRAM slot pinned is dropped, "busy": on a loaded machine a block may
    # be in no tier; the hit is what the tiers hold)
    assert expected >= 1.0, [[m for m in MEDIA if bytes(k) in want[m]] for k in keys]
    router = FleetRouter()
    request = RouteRequest(token_ids=ids)
    hits = router.hits(request, [ReplicaView("r", provenance=old, block_size=BS, index=router_index)])
    assert hits["r"] == pytest.approx(expected)

    # new weights: the tiers keep the old version's units; they are never a hit under the new one
    llm.engine.update_weights(load_hf_state_dict(moe_dir_other_weights), weights_version="v2")
    new = llm.engine.provenance
    settle(llm)
    for seq, payload in replay_all(llm.engine.kv_events.replay_endpoint, router_index.next_seq):
        router_index.apply(seq, decode_batch(payload))
    still = truth(llm)
    assert any(bytes(k) in still[m] for k in keys for m in ("dram", "disk", "shared"))  # the old units are there
    assert router.hits(request, [ReplicaView("r", provenance=new, block_size=BS, index=router_index)])["r"] == 0.0
    assert router.hits(request, [ReplicaView("r", provenance=old, block_size=BS, index=router_index)])["r"] > 0
    out = run(llm, ids)
    assert out.prompt_token_sources["offloaded"] == 0  # nor does the engine reload them
    # the units the new version writes back are named by it
    churn(llm, keys_of(llm, ids), first_seed=500)
    settle(llm)
    index = MediaIndex()
    index.follow(llm.engine.kv_events.replay_endpoint)
    check_exact(index, llm)
    tier_versions = {ev.weights_version for (m, _), ev in index.stored.items() if m != "pool"}
    assert tier_versions == {old.weights_version, "user:v2"}
    llm.engine.offload.close()
    llm.engine.kv_events.close()

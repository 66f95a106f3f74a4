"""Offload tiers in the engine (engine/offload.py): a prompt whose blocks were evicted from the pool
is served from DRAM, disk or Redis with the same tokens and routes as the same prompt cold (the
oracle), restored into other slots than the ones it was computed in (the R3 bug of restoring
routes by slot), and reported as ``offloaded`` in ``prompt_token_sources``."""

from __future__ import annotations

import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from offload_helpers import (
    BS,
    GREEDY,
    check_clean,
    churn,
    close,
    keys_of,
    make,
    prompt,
    run,
    same_output,
    slots_of,
)

from execstate import SamplingParams
from execstate.engine import offload as offload_module
from execstate.engine.request import RequestStatus
from execstate.state.tiers.disk_store import DiskStore

TIERS = ["dram", "disk", "redis", "dram+disk+redis"]


def tier_options(which: str, tmp_path, request) -> dict:
    kw: dict = {}
    if "dram" in which:
        kw["offload_dram_bytes"] = 64 << 20
    if "disk" in which:
        kw["offload_disk_dir"] = str(tmp_path / "disk")
    if "redis" in which:
        kw["offload_redis_url"] = request.getfixturevalue("redis_server").url
    return kw


@pytest.fixture(scope="module")
def cold(moe_dir):
    """The oracle: an engine without tiers, every prompt computed."""
    return make(moe_dir, num_kv_blocks=64)


@pytest.mark.parametrize("which", TIERS)
def test_served_from_a_tier_equals_cold_in_other_slots(which, moe_dir, cold, tmp_path, request):
    llm = make(moe_dir, **tier_options(which, tmp_path, request))
    try:
        a = prompt(1)
        ref = run(cold, a)
        first = run(llm, a)
        same_output(first, ref)
        keys = keys_of(llm, a)
        before = slots_of(llm, keys)
        assert None not in before
        churn(llm, keys)
        again = run(llm, a)
        same_output(again, ref)
        assert again.prompt_token_sources == {"local_cache": 0, "offloaded": 96, "transferred": 0, "computed": 4}
        after = slots_of(llm, keys)  # the reloaded units were committed to the pool again
        assert None not in after and after != before  # restored into other slots, routes unchanged
        done = llm.engine.offload.loads.last_done
        first_tier = which.split("+")[0]
        assert done.num_verified == 6 and done.sources == [first_tier] * 6 and done.failures == []
        snap = {t.name: t for t in llm.engine.offload.snapshot()}
        assert snap[first_tier].reloaded == 6 and snap[first_tier].hits >= 6
        assert snap[first_tier].checksum_failures == 0
        check_clean(llm)
    finally:
        close(llm)


def test_unaligned_prompt_and_partial_tier_hit(moe_dir, cold, tmp_path):
    """A 96-token prompt: its last token is always computed; a prompt extending an offloaded one
    reloads the shared blocks and computes the rest."""
    llm = make(moe_dir, offload_dram_bytes=64 << 20)
    try:
        a = prompt(2, 96)
        run(llm, a)
        churn(llm, keys_of(llm, a))
        out = run(llm, a)
        same_output(out, run(cold, a))
        assert out.prompt_token_sources == {"local_cache": 0, "offloaded": 95, "transferred": 0, "computed": 1}
        longer = a + prompt(3, 40)
        churn(llm, keys_of(llm, a))
        out = run(llm, longer)
        same_output(out, run(cold, longer))
        assert out.prompt_token_sources["offloaded"] == 96 and out.prompt_token_sources["computed"] == 40
        check_clean(llm)
    finally:
        close(llm)


def test_pool_hit_then_tier_hit(moe_dir, cold):
    """The pool's own blocks first (local_cache), the tier's after them (offloaded)."""
    llm = make(moe_dir, offload_dram_bytes=64 << 20)
    try:
        a = prompt(4, 160)
        run(llm, a)
        keys = keys_of(llm, a)
        churn(llm, keys)
        run(llm, a[: 3 * BS + 5])  # reloads blocks 0..2, they stay cached in the pool
        out = run(llm, a)
        same_output(out, run(cold, a))
        assert out.prompt_token_sources == {"local_cache": 48, "offloaded": 112, "transferred": 0, "computed": 0} \
            or out.prompt_token_sources == {"local_cache": 48, "offloaded": 111, "transferred": 0, "computed": 1}
        check_clean(llm)
    finally:
        close(llm)


def test_dense_model(dense_dir, tmp_path):
    cold = make(dense_dir, num_kv_blocks=64)
    llm = make(dense_dir, offload_dram_bytes=16 << 20, offload_disk_dir=str(tmp_path / "d"))
    try:
        a = prompt(5)
        run(llm, a)
        churn(llm, keys_of(llm, a))
        out = run(llm, a)
        same_output(out, run(cold, a))
        assert out.outputs[0].routed_experts is None and out.prompt_token_sources["offloaded"] == 96
    finally:
        close(llm)


def test_other_tenant_salt_never_hits(moe_dir, cold):
    llm = make(moe_dir, offload_dram_bytes=64 << 20)
    try:
        a = prompt(6)
        run(llm, a, salt="tenant-a")
        churn(llm, keys_of(llm, a, "tenant-a"))
        out = run(llm, a, salt="tenant-b")
        assert out.prompt_token_sources == {"local_cache": 0, "offloaded": 0, "transferred": 0, "computed": 100}
        same_output(out, run(cold, a))
        out = run(llm, a, salt="tenant-a")
        assert out.prompt_token_sources["offloaded"] == 96
    finally:
        close(llm)


def test_units_of_old_weights_never_hit_after_an_update(moe_dir, moe_dir_other_weights):
    llm = make(moe_dir, offload_dram_bytes=64 << 20)
    try:
        a = prompt(7)
        run(llm, a)
        churn(llm, keys_of(llm, a))
        llm.update_weights(str(moe_dir_other_weights))
        out = run(llm, a)
        assert out.prompt_token_sources["offloaded"] == 0 and out.prompt_token_sources["computed"] == 100
        same_output(out, run(make(moe_dir_other_weights, num_kv_blocks=64), a))
    finally:
        close(llm)


def test_forced_routes_are_never_served_from_a_tier(moe_dir):
    llm = make(moe_dir, offload_dram_bytes=64 << 20)
    try:
        a = prompt(8)
        routes = run(llm, a).outputs[0].routed_experts
        churn(llm, keys_of(llm, a))
        replay = SamplingParams(temperature=0.0, max_tokens=1, routed_experts=routes[:99])
        out = run(llm, a, replay)
        assert out.prompt_token_sources["offloaded"] == 0
    finally:
        close(llm)


class GatedDisk(DiskStore):
    """A disk tier whose reads wait for ``gate`` (test double: a slow tier)."""

    gate = threading.Event()

    def get(self, key):
        assert self.gate.wait(30)
        return super().get(key)


def test_reload_is_asynchronous_and_abort_safe(moe_dir, cold, tmp_path, monkeypatch):
    """While a reload waits on a slow tier, the engine keeps decoding another request; an aborted
    reloading request frees its blocks only once its reload ended."""
    monkeypatch.setattr(offload_module, "DiskStore", GatedDisk)
    GatedDisk.gate.clear()
    llm = make(moe_dir, offload_disk_dir=str(tmp_path / "d"), offload_timeout_s=30.0)
    eng = llm.engine
    try:
        a, c = prompt(9), prompt(10)
        GatedDisk.gate.set()
        run(llm, a)
        run(llm, c)
        churn(llm, keys_of(llm, a) + keys_of(llm, c))
        GatedDisk.gate.clear()
        long = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
        b = eng.add_request({"prompt_token_ids": prompt(11, 20)}, long)
        eng.step()
        ra = eng.add_request({"prompt_token_ids": a}, GREEDY)
        rc = eng.add_request({"prompt_token_ids": c}, GREEDY)
        eng.step()
        assert eng.requests[ra].status is RequestStatus.WAITING_FOR_REMOTE_KVS
        tokens_while_waiting = 0
        for _ in range(6):
            for out in eng.step():
                if out.request_id == b:
                    tokens_while_waiting = len(out.outputs[0].token_ids) if not out.finished else 40
        assert tokens_while_waiting >= 5  # b advanced while a's reload waited
        assert eng.abort_request(rc) is not None  # c: finished now, blocks held until its reload ends
        GatedDisk.gate.set()
        outs = {}
        while eng.has_unfinished_requests():
            for out in eng.step():
                if out.finished:
                    outs[out.request_id] = out
        same_output(outs[ra], run(cold, a))
        assert outs[ra].prompt_token_sources["offloaded"] == 96
        check_clean(llm)
    finally:
        GatedDisk.gate.set()
        close(llm)


def test_sessions_run_with_tiers(moe_dir):
    llm = make(moe_dir, offload_dram_bytes=64 << 20)
    try:
        s = llm.open_session(sampling_params=GREEDY)
        r1 = s.step(prompt(12, 40), max_tokens=4)
        r2 = s.step(prompt(13, 40), max_tokens=4)
        assert len(r1.token_ids) == 4 and len(r2.token_ids) == 4
        s.close()
        churn(llm, keys_of(llm, prompt(12, 40)))
        check_clean(llm)
    finally:
        close(llm)


def test_a_corrupt_dram_unit_is_served_from_the_next_tier(moe_dir, cold, tmp_path):
    from execstate_bench.offload_desync import UnitAccess

    llm = make(moe_dir, offload_dram_bytes=64 << 20, offload_disk_dir=str(tmp_path / "d"))
    try:
        a, b = prompt(14), prompt(15)
        run(llm, a)
        run(llm, b)
        keys_a, keys_b = keys_of(llm, a), keys_of(llm, b)
        churn(llm, keys_a + keys_b)
        dram = UnitAccess(llm)
        rec, routes, _ = dram.read(keys_a[2])
        dram.write(keys_a[2], rec, routes, dram.read(keys_b[2])[2])  # DRAM's copy: another block's KV
        out = run(llm, a)
        same_output(out, run(cold, a))
        assert out.prompt_token_sources["offloaded"] == 96  # nothing recomputed: disk had a good copy
        done = llm.engine.offload.loads.last_done
        assert done.sources == ["dram", "dram", "disk", "dram", "dram", "dram"]
        assert [(f.tier, f.kind) for f in done.failures] == [("dram", "checksum")]
        check_clean(llm)  # includes: no DRAM slot left pinned once the write-backs are done
    finally:
        close(llm)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 90), st.integers(0, 3), st.integers(0, 40),
                          st.sampled_from([None, "t1"])), min_size=3, max_size=6))
def test_random_workloads_match_the_oracle(moe_dir, cold, tmp_path_factory, requests):
    """Prompts built from shared documents, on a small pool with a small DRAM tier and a disk tier:
    every reply equals the cold engine's (tokens and routes) and nothing leaks."""
    docs = [prompt(100 + d, 90) for d in range(4)]
    unit_probe = cold.engine.kv_pool.unit_nbytes()
    llm = make(moe_dir, num_kv_blocks=16, offload_dram_bytes=6 * unit_probe,
               offload_disk_dir=str(tmp_path_factory.mktemp("disk")), offload_disk_bytes=40 * unit_probe)
    try:
        for a, la, b, lb, salt in requests:
            ids = docs[a][:la] + docs[b][:lb]
            same_output(run(llm, ids, salt=salt), run(cold, ids))
        check_clean(llm)
        assert all(t.checksum_failures == 0 for t in llm.engine.offload.snapshot())
    finally:
        close(llm)

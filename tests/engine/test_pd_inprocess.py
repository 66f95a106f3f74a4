"""Prefill/decode disaggregation between two engines in one process (NIXL + ZeroMQ).

The routes of every token range must come from the same source as its KV
(docs/contracts.md 5): D's own cache, P's records sent with the KV, D's fresh capture.
Route records are tampered with (valid but distinguishable expert ids) so each
range's source is visible in the returned array.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from execstate.engine.config import EngineConfig
from execstate.engine.llm_engine import LLMEngine
from execstate.engine.pd_connector import PDConfig
from execstate.engine.sampling_params import SamplingParams
from execstate_bench.faults import FaultInjection, importer_factory

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
SECRET = "in-process-test-secret-0123456789"


def engine(model_dir, role: str | None = None, kernels: str = "auto", faults: dict | None = None,
           **pd_kw) -> LLMEngine:
    """An engine; with ``role`` a PD connector sharing SECRET; ``faults``: the decode side loads
    through a FaultyImporter (passed to the connector as its ``make_importer``)."""
    cfg = None
    if role is not None:
        pd_kw.setdefault("secret", SECRET)
        cfg = PDConfig(role=role, timeout_s=5.0, **pd_kw)
    make_importer = None if faults is None else importer_factory(FaultInjection.from_dict(faults))
    return LLMEngine(EngineConfig(model=str(model_dir), enable_return_routed_experts=True, block_size=16,
                                  kernels=kernels, kv_transfer=cfg), make_importer=make_importer)


def run(e: LLMEngine, ids, params=GREEDY, kv=None):
    rid = e.add_request({"prompt_token_ids": ids}, params, kv_transfer_params=kv)
    while True:
        for out in e.step():
            if out.request_id == rid and out.finished:
                return out


def prompt(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 500, n).tolist()


@pytest.fixture()
def pd_pair(moe_dir):
    p, d = engine(moe_dir, "kv_producer"), engine(moe_dir, "kv_consumer")
    yield p, d
    p.pd.close()
    d.pd.close()


def assert_load_failed_and_healthy(d: LLMEngine, out, healthy_prompt: list[int]) -> None:
    """A failed KV load is a request-level abort (no tokens, no routes, no blocks held) and
    the decode instance keeps serving."""
    assert out.outputs[0].finish_reason == "abort"
    assert out.error and "KV load" in out.error
    assert out.outputs[0].routed_experts is None and out.outputs[0].token_ids == []
    assert d.block_pool.num_used == 0
    assert len(run(d, healthy_prompt).outputs[0].token_ids) == 8
    d.check_integrity()


def handoff(p: LLMEngine, ids) -> dict:
    out = run(p, ids, SamplingParams(temperature=0.0, max_tokens=1), kv={"do_remote_decode": True})
    assert out.outputs[0].finish_reason == "length" and out.error is None
    return out, out.kv_transfer_params


def test_48_token_case_routes_follow_their_kv(pd_pair, moe_dir):
    p, d = pd_pair
    ids = prompt(1, 48)
    # D holds the first 32 tokens in its own cache; make its records distinguishable.
    run(d, ids[:32] + [7])
    d.kv_manager.update_block_keys(_probe := _req_for(d, ids))
    for key in _probe.cache.block_keys[:2]:
        rec = d.route_store.get(key)[..., ::-1].copy()  # swap top-2 order: valid, distinct
        rec.setflags(write=False)
        d.route_store._records[key] = rec
    d_rows = np.concatenate([d.route_store.get(k) for k in _probe.cache.block_keys[:2]])
    # P's exported records for block 2 are tampered the same way on their way out.
    real_export = p.pd.exporter.export
    exported = {}

    def tampered(tid, epoch, block_ids, keys, routes, num_tokens):
        exported["rows"] = routes.copy()  # P's own rows for [0, 48)
        routes = routes.copy()
        routes[32:48] = routes[32:48, :, ::-1]
        return real_export(tid, epoch, block_ids, keys, routes, num_tokens)

    p.pd.exporter.export = tampered
    p_out, kv = handoff(p, ids)
    assert p_out.outputs[0].routed_experts is None  # routes travel with the KV, not the reply
    p_rows = exported["rows"]
    out = run(d, ids, kv=kv)
    r = out.outputs[0].routed_experts
    assert out.prompt_token_sources == {"local_cache": 32, "offloaded": 0, "transferred": 15, "computed": 1}
    np.testing.assert_array_equal(r[:32], d_rows)  # D's records, never P's
    assert not np.array_equal(r[:32], p_rows[:32])
    np.testing.assert_array_equal(r[32:47], p_rows[32:47, :, ::-1])  # P's (tampered) records
    np.testing.assert_array_equal(r[47], p_rows[47])  # D's fresh capture of token 47
    p.poll()
    assert p.pd.num_pinned_exports == 0  # D released the transfer
    d.check_integrity()


def _req_for(e: LLMEngine, ids):
    from execstate.engine.request import Request

    return Request("probe", list(ids), GREEDY, e.max_model_len)


def test_pd_equals_single_instance(pd_pair, moe_dir):
    p, d = pd_pair
    ids = prompt(2, 70)
    single = run(engine(moe_dir), ids)
    _, kv = handoff(p, ids)
    out = run(d, ids, kv=kv)
    assert out.prompt_token_sources == {"local_cache": 0, "offloaded": 0, "transferred": 64, "computed": 6}
    assert out.outputs[0].token_ids == single.outputs[0].token_ids
    np.testing.assert_array_equal(out.outputs[0].routed_experts, single.outputs[0].routed_experts)
    p.poll()
    assert p.pd.num_pinned_exports == 0
    assert d.block_pool.num_used == 0 and p.block_pool.num_used == 0


@pytest.mark.parametrize("mode", ["corrupt", "drop", "truncate", "stale_transfer_id", "duplicate"])
def test_faults_fail_policy_is_request_level(moe_dir, mode):
    p = engine(moe_dir, "kv_producer", ttl_s=2.0)
    d = engine(moe_dir, "kv_consumer", faults={"mode": mode, "delay_s": 0.0})
    try:
        ids = prompt(3, 40)
        _, kv = handoff(p, ids)
        out = run(d, ids, kv=kv)
        # every injected fault is detected (a duplicated load finds the transfer released)
        assert_load_failed_and_healthy(d, out, prompt(4, 20))
    finally:
        p.pd.close()
        d.pd.close()


def test_numerics_mismatch_is_rejected(moe_dir):
    """P on torch ops, D on execstate's kernels: their KV rounds differently, so their
    provenance differs and D must refuse P's blocks (request-level error, D healthy)."""
    from execstate.kernels import cpu

    if not cpu.available():
        pytest.skip(f"execstate CPU kernels unavailable: {cpu.unavailable_reason()}")
    p = engine(moe_dir, "kv_producer", kernels="torch")
    d = engine(moe_dir, "kv_consumer", kernels="execstate")
    try:
        assert p.provenance.numerics == "eager+cpu-torch-v1" and d.provenance.numerics == f"eager+{cpu.KERNEL_SET}"
        ids = prompt(5, 40)
        _, kv = handoff(p, ids)
        out = run(d, ids, kv=kv)
        assert out.error and "provenance" in out.error
        assert_load_failed_and_healthy(d, out, prompt(6, 20))
    finally:
        p.pd.close()
        d.pd.close()


def test_corrupt_transfer_recompute_policy_returns_own_routes(moe_dir):
    p = engine(moe_dir, "kv_producer")
    d = engine(moe_dir, "kv_consumer", failure_policy="recompute", faults={"mode": "corrupt"})
    try:
        ids = prompt(5, 40)
        single = run(engine(moe_dir), ids)
        _, kv = handoff(p, ids)
        out = run(d, ids, kv=kv)
        assert out.error is None
        assert out.prompt_token_sources["transferred"] < 32  # the corrupt block and after: recomputed
        assert out.outputs[0].token_ids == single.outputs[0].token_ids
        np.testing.assert_array_equal(out.outputs[0].routed_experts, single.outputs[0].routed_experts)
        d.check_integrity()
    finally:
        p.pd.close()
        d.pd.close()


def test_export_limits_are_request_level_and_expire(moe_dir):
    p = engine(moe_dir, "kv_producer", max_inflight=1, ttl_s=0.5)
    try:
        base_used = p.block_pool.num_used
        _, kv1 = handoff(p, prompt(6, 40))  # pinned: nobody pulls it
        assert p.pd.num_pinned_exports == 1 and p.block_pool.num_used == base_used + 2
        over = run(p, prompt(7, 40), SamplingParams(temperature=0.0, max_tokens=1), kv={"do_remote_decode": True})
        assert over.outputs[0].finish_reason == "abort" and "KV export failed" in over.error
        ok = run(p, prompt(8, 20))  # the engine keeps serving
        assert len(ok.outputs[0].token_ids) == 8
        time.sleep(0.6)
        p.poll()  # TTL passed: the export is released, blocks back to baseline
        assert p.pd.num_pinned_exports == 0 and p.block_pool.num_used == base_used
        p.check_integrity()
    finally:
        p.pd.close()


def test_uncancellable_read_fences_its_blocks_and_fails_the_request(moe_dir, monkeypatch):
    p = engine(moe_dir, "kv_producer")
    d = engine(moe_dir, "kv_consumer", failure_policy="recompute")
    try:
        ids = prompt(9, 40)
        _, kv = handoff(p, ids)
        bulk = d.pd.bulk
        stuck = StuckRead()
        real_load = d.pd.importer.load

        def stuck_load(*args, **kwargs):
            res = real_load(*args, **kwargs)
            bulk._stuck[999] = stuck  # as if a timed-out read could not be cancelled
            return res

        monkeypatch.setattr(d.pd.importer, "load", stuck_load)
        monkeypatch.setattr(bulk, "_xfer_state", lambda h: h.state)
        out = run(d, ids, kv=kv)
        assert out.outputs[0].finish_reason == "abort" and "could not be cancelled" in out.error
        fenced = d.pd.fenced_blocks
        assert len(fenced) == 2 and d.block_pool.num_used == 2  # held while the read may write
        assert all(d.block_pool.ref_count(b) == 1 for b in fenced)
        ok = run(d, prompt(10, 40))
        assert len(ok.outputs[0].token_ids) == 8
        stuck.state = "DONE"  # NIXL reports the read ended: the blocks go back to the pool
        deadline = time.monotonic() + 10
        while d.pd.fenced_blocks and time.monotonic() < deadline:
            time.sleep(0.02)
            d.poll()
        assert d.pd.fenced_blocks == [] and stuck.released and d.block_pool.num_used == 0
        assert d.pd.stats.reclaimed_blocks == 2
        d.check_integrity()
    finally:
        p.pd.close()
        d.pd.close()


class StuckRead:
    """A NIXL transfer handle that cannot be released while its state is PROC (a test double)."""

    def __init__(self) -> None:
        self.state = "PROC"
        self.released = False

    def release(self) -> None:
        if self.state == "PROC":
            raise RuntimeError("cannot cancel an active transfer")
        self.released = True

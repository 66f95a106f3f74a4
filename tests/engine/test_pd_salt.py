"""A salted request across prefill/decode (NIXL + ZeroMQ in one process): D computes the
expected block keys from its own provenance and the request's salt, so the KV loads from P
only when both sides got the same salt (the proxy forwards the body to both)."""

from __future__ import annotations

import numpy as np
import pytest

from execstate.engine.config import EngineConfig
from execstate.engine.llm_engine import LLMEngine
from execstate.engine.pd_connector import PDConfig
from execstate.engine.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def engine(model_dir, role: str | None = None, **pd_kw) -> LLMEngine:
    pd = None
    if role is not None:
        pd_kw.setdefault("secret", "salt-test-handoff-secret-0123")  # P signs, D verifies
        pd = PDConfig(role=role, timeout_s=5.0, **pd_kw)
    return LLMEngine(EngineConfig(model=str(model_dir), enable_return_routed_experts=True, block_size=16,
                                  kv_transfer=pd))


def run(e: LLMEngine, ids, salt, params=GREEDY, kv=None):
    p = {"prompt_token_ids": ids} if salt is None else {"prompt_token_ids": ids, "cache_salt": salt}
    rid = e.add_request(p, params, kv_transfer_params=kv)
    while True:
        for out in e.step():
            if out.request_id == rid and out.finished:
                return out


@pytest.fixture()
def pd_pair(moe_dir):
    p, d = engine(moe_dir, "kv_producer"), engine(moe_dir, "kv_consumer", failure_policy="recompute")
    yield p, d
    p.pd.close()
    d.pd.close()


def handoff(p: LLMEngine, ids, salt) -> dict:
    out = run(p, ids, salt, SamplingParams(temperature=0.0, max_tokens=1), kv={"do_remote_decode": True})
    assert out.error is None
    return out.kv_transfer_params


def test_same_salt_loads_from_p(pd_pair, moe_dir):
    p, d = pd_pair
    ids = np.random.default_rng(1).integers(3, 500, 70).tolist()
    single = run(engine(moe_dir), ids, "tenant-a")
    out = run(d, ids, "tenant-a", kv=handoff(p, ids, "tenant-a"))
    assert out.prompt_token_sources == {"local_cache": 0, "offloaded": 0, "transferred": 64, "computed": 6}
    assert out.outputs[0].token_ids == single.outputs[0].token_ids
    np.testing.assert_array_equal(out.outputs[0].routed_experts, single.outputs[0].routed_experts)
    # D now holds tenant-a's units: another tenant on D gets none of them.
    assert run(d, ids, "tenant-b").num_cached_tokens == 0
    assert run(d, ids, "tenant-a").num_cached_tokens == 64
    d.check_integrity()


@pytest.mark.parametrize(("p_salt", "d_salt"), [("tenant-a", "tenant-b"), ("tenant-a", None), (None, "tenant-a")])
def test_different_salt_never_loads_the_other_tenants_kv(pd_pair, moe_dir, p_salt, d_salt):
    p, d = pd_pair
    ids = np.random.default_rng(2).integers(3, 500, 40).tolist()
    single = run(engine(moe_dir), ids, d_salt)
    out = run(d, ids, d_salt, kv=handoff(p, ids, p_salt))
    assert out.error is None and out.prompt_token_sources["transferred"] == 0  # keys differ: recomputed on D
    assert out.outputs[0].token_ids == single.outputs[0].token_ids
    np.testing.assert_array_equal(out.outputs[0].routed_experts, single.outputs[0].routed_experts)
    d.check_integrity()

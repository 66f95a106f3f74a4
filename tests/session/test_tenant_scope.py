"""The tenant in the execution identity, end to end on real engines (docs/security.md "Identity").

- A hypothesis test of random requests from two tenants, with salts drawn from both tenants'
  vocabularies, over the pool and the DRAM, disk and Redis tiers: no block ever crosses tenants
  (a request hits only what its own scope computed), and a same-scope repeat always hits.
- A migrated session keeps its tenant: on the target, another tenant's request for the same
  tokens gets nothing, the owner's hits the migrated blocks.
- One derivation: the engine, the fleet router, a session and a hibernation's units compute the
  same keys for the same request.
- The device is in the identity: the torch ops and the C kernels, sharing a disk tier and its
  secret, never reload each other's units.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from migration_helpers import Engines

from execstate import LLM, SamplingParams
from execstate.fleet.router.prompt_keys import request_keys
from execstate.identity.scope import CacheScope
from execstate.identity.tenant import TenantId
from execstate.kernels import cpu as cpu_kernels
from execstate.session.lm.hibernation_state import block_units
from execstate.session.lm.migration import migrate_session
from execstate.session.lm.offline import Session
from execstate.session.runtime.access import Access, Owner
from execstate.state.block_holds import HeldBlocks

BS = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
SECRET = "tenant-scope-test-secret-0123456789"
PROMPTS = [np.random.default_rng(900 + i).integers(3, 500, 49).tolist() for i in range(4)]  # 3 full blocks
SALTS = [None, "alpha-secret", "bravo-secret", "shared-word"]  # both tenants' vocabularies, and a common one


def run(llm: LLM, ids: list[int], scope: CacheScope):
    eng = llm.engine
    rid = eng.add_request({"prompt_token_ids": ids}, GREEDY, scope=scope)
    done = None
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.request_id == rid and out.finished:
                done = out
    assert done is not None
    if eng.offload is not None:
        assert eng.offload.flush()  # evicted units are in their tiers before the next request looks
    return done


@pytest.fixture()
def tiered(moe_dir, tmp_path, redis_server):
    d = tmp_path
    llm = LLM(str(moe_dir), enable_return_routed_experts=True, block_size=BS, max_model_len=128, num_kv_blocks=10,
              seed=0, offload_dram_bytes=1 << 20, offload_disk_dir=str(d / "disk"),
              offload_redis_url=redis_server.url, offload_secret=SECRET, offload_timeout_s=30.0)
    yield llm
    llm.engine.offload.close()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.sampled_from(["alpha", "bravo"]), st.sampled_from(SALTS), st.integers(0, 3)),
                    min_size=4, max_size=14))
def test_no_block_crosses_tenants_and_a_repeat_always_hits(tiered, ops):
    # fresh prompts for every example (hypothesis replays one too), whatever an earlier example or run
    # left in the pool and the tiers: 49 tokens drawn from fresh entropy collide with none of them
    rng = np.random.default_rng()
    prompts = [rng.integers(3, 500, 49).tolist() for _ in PROMPTS]
    seen: set[tuple[str, str | None, int]] = set()
    for tenant, salt, i in ops:
        out = run(tiered, prompts[i], CacheScope.build(tenant, salt))
        src = out.prompt_token_sources
        reused = src["local_cache"] + src["offloaded"]
        if (tenant, salt, i) in seen:
            assert reused == 48, (tenant, salt, i, src)  # pool or a tier: the scope's own blocks
        else:
            assert reused == 0, (tenant, salt, i, src)  # nothing another scope computed
        seen.add((tenant, salt, i))
    tiered.engine.check_integrity()


def test_a_migrated_session_keeps_its_tenant(moe_dir):
    engines = Engines(moe_dir)
    try:
        a, b = engines(llm_kw={"block_size": BS}), engines(llm_kw={"block_size": BS})
        alpha = Access(Owner(TenantId("alpha")))
        s = Session(a.sessions, a.sessions.open("mig", GREEDY, access=alpha))
        s.step(PROMPTS[0])
        moved = migrate_session(s, b).session
        moved.step([7, 8])  # its next step registers the loaded blocks in b's cache, under its identity
        ids = moved.token_ids[:49]
        assert run(b, ids, CacheScope.build("bravo")).num_cached_tokens == 0
        assert run(b, ids, CacheScope.build("alpha")).num_cached_tokens == 48
    finally:
        engines.close()


def test_engine_router_session_and_hibernation_derive_the_same_keys(moe_dir):
    llm = LLM(str(moe_dir), enable_return_routed_experts=True, block_size=BS, max_model_len=128, seed=0)
    eng = llm.engine
    scope = CacheScope.build("alpha", "s")
    ids = PROMPTS[1]
    from execstate.engine.request import Request

    req = Request("probe", ids, GREEDY, 128, scope=scope)
    eng.kv_manager.update_block_keys(req)
    engine_keys = req.cache.block_keys
    assert len(engine_keys) == 3
    assert request_keys(eng.provenance, BS, ids, scope) == engine_keys  # the router ((49 - 1) // 16 = 3 blocks)
    alpha = Access(Owner(TenantId("alpha")))
    rt = llm.sessions.open("k", GREEDY, cache_salt="s", access=alpha)
    state = rt.state
    state.token_ids = list(ids)
    assert state.chain()[0] == engine_keys[-1]  # a session's chain
    units = block_units(ids, state.identity, HeldBlocks(list(range(4)), len(ids)), None, BS)
    assert [u[1] for u in units] == engine_keys  # a hibernation's (and a migration's) units


@pytest.mark.skipif(not cpu_kernels.available(), reason=str(cpu_kernels.unavailable_reason()))
def test_torch_ops_and_c_kernels_never_reload_each_others_units(moe_dir, tmp_path):
    def make(kernels: str) -> LLM:
        return LLM(str(moe_dir), enable_return_routed_experts=True, block_size=BS, max_model_len=128, seed=0,
                   num_kv_blocks=8, kernels=kernels, offload_disk_dir=str(tmp_path / "disk"), offload_secret=SECRET)

    torch_path, kernels = make("torch"), make("execstate")
    assert torch_path.engine.provenance.numerics == "eager+cpu-torch-v1"
    assert kernels.engine.provenance.numerics == f"eager+{cpu_kernels.KERNEL_SET}"
    ids = PROMPTS[2]
    run(torch_path, ids, CacheScope.build("alpha"))
    for i in range(3):  # churn the pool: the units go to the shared disk tier
        run(torch_path, PROMPTS[(i + 3) % 4][::-1], CacheScope.build("alpha"))
    assert torch_path.engine.offload.flush()
    assert run(kernels, ids, CacheScope.build("alpha")).prompt_token_sources["offloaded"] == 0
    fresh = make("torch")
    assert fresh.engine.provenance.numerics == "eager+cpu-torch-v1"
    assert run(fresh, ids, CacheScope.build("alpha")).prompt_token_sources["offloaded"] == 48  # same device: shared

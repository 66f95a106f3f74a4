"""Per-request cache_salt (identity/scope.py), offline and on the engine API: salts never share a
block, and nothing a request gets back (cached_tokens, prompt_token_sources) counts another
salt's prefix. Tenants over HTTP: tests/security/test_identity_isolation.py."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from execstate import LLM
from execstate.engine.request import Request
from execstate.engine.sampling_params import SamplingParams
from execstate.identity.execution import ExecutionIdentity
from execstate.identity.scope import LOCAL_SCOPE, MAX_CACHE_SALT_CHARS, CacheScope

_FRESH = itertools.count(10**6)
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
BS = 4


def llm(path, **kw) -> LLM:
    return LLM(str(path), enable_return_routed_experts=True, block_size=BS, max_model_len=128, **kw)


@pytest.fixture(scope="module")
def shared(moe_dir) -> LLM:
    return llm(moe_dir)


def prompt(seed: int, n: int = 40) -> list[int]:
    return np.random.default_rng(seed).integers(3, 500, n).tolist()


def gen(e: LLM, ids: list[int], salt: str | None = None, params: SamplingParams = GREEDY):
    p: dict = {"prompt_token_ids": ids}
    if salt is not None:
        p["cache_salt"] = salt
    return e.generate(p, params, use_tqdm=False)[0]


def keys(e: LLM, ids: list[int], salt: str | None) -> list[bytes]:
    req = Request("probe", ids, GREEDY, 128, scope=LOCAL_SCOPE.with_salt(salt))
    e.engine.kv_manager.update_block_keys(req)
    return req.cache.block_keys


def test_tenants_never_share_and_same_tenant_hits(shared):
    ids = prompt(1)
    full = (len(ids) - 1) // BS * BS  # 36: every full block but the one holding the last token
    cold = gen(shared, ids, "tenant-a")
    assert cold.num_cached_tokens == 0
    hit = gen(shared, ids, "tenant-a")
    assert hit.num_cached_tokens == full and hit.prompt_token_sources["local_cache"] == full
    for other in ("tenant-b", None, "tenant-a ", "Tenant-a"):
        out = gen(shared, ids, other)
        assert out.num_cached_tokens == 0, other  # another tenant's prefix is invisible
        assert out.prompt_token_sources == {"local_cache": 0, "offloaded": 0, "transferred": 0, "computed": 40}
    assert gen(shared, ids).num_cached_tokens == full  # unsalted requests share among themselves
    # Routes of a salted hit are the cold run's (and every tenant computes the same ones).
    np.testing.assert_array_equal(hit.outputs[0].routed_experts, cold.outputs[0].routed_experts)
    assert hit.outputs[0].token_ids == cold.outputs[0].token_ids
    shared.engine.check_integrity()


def test_block_keys_follow_the_salted_provenance(shared):
    ids = prompt(2)
    prov = shared.engine.provenance
    ka, kb, kn = keys(shared, ids, "a"), keys(shared, ids, "b"), keys(shared, ids, None)
    assert len(ka) == len(kb) == len(kn) == 10
    assert not (set(ka) & set(kb)) and not (set(ka) & set(kn)) and not (set(kb) & set(kn))
    assert ka == ExecutionIdentity(prov, CacheScope.build(salt="a")).chain(ids, BS)  # the one derivation
    assert kn == ExecutionIdentity(prov).chain(ids, BS)
    kv = shared.engine.kv_manager
    assert kv.identity(CacheScope.build(salt="a")).root != kv.identity().root


def test_scope_given_to_the_engine_keys_the_tenant_and_a_dict_salt_narrows_it(shared):
    ids = prompt(3)
    alpha, bravo = CacheScope.build("alpha"), CacheScope.build("bravo")

    def run(scope, salt=None):
        p = {"prompt_token_ids": ids} | ({"cache_salt": salt} if salt else {})
        rid = shared.engine.add_request(p, GREEDY, scope=scope)
        while shared.engine.has_unfinished_requests():
            for out in shared.engine.step():
                if out.request_id == rid and out.finished:
                    found = out
        return found

    assert run(alpha).num_cached_tokens == 0
    assert run(alpha).num_cached_tokens == 36
    assert run(bravo).num_cached_tokens == 0  # another tenant, the same tokens: nothing
    assert run(bravo, "s").num_cached_tokens == 0 and run(alpha, "s").num_cached_tokens == 0
    assert run(alpha, "s").num_cached_tokens == 36
    with pytest.raises(ValueError, match="given twice"):
        shared.engine.add_request({"prompt_token_ids": ids, "cache_salt": "x"}, GREEDY, scope=alpha.with_salt("y"))


def test_salt_with_n_choices_and_text_free_dict(shared):
    ids = prompt(4)
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, n=3)
    gen(shared, ids, "n-tenant")
    out = gen(shared, ids, "n-tenant", params)
    assert len(out.outputs) == 3 and out.num_cached_tokens == 36  # every choice hit the tenant's prefix
    assert gen(shared, ids, "other-n-tenant", params).num_cached_tokens == 0


@pytest.mark.parametrize(
    "salt", ["", "x" * (MAX_CACHE_SALT_CHARS + 1), 5, b"salt", ["a"], "bad\ud800"]
)
def test_bad_salt_is_a_value_error_and_nothing_is_queued(shared, salt):
    good = {"prompt_token_ids": prompt(5)}
    bad = {"prompt_token_ids": prompt(6), "cache_salt": salt}
    with pytest.raises(ValueError, match="cache_salt"):
        shared.generate([good, bad], GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="cache_salt"):
        shared.engine.add_request(bad, GREEDY)
    assert not shared.engine.has_unfinished_requests() and not shared.engine.requests
    assert len(gen(shared, prompt(5), "x" * MAX_CACHE_SALT_CHARS).outputs[0].token_ids) == 6  # the bound is fine


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(s1=st.text(min_size=1, max_size=20), s2=st.text(min_size=1, max_size=20))
def test_second_request_hits_iff_same_salt(shared, s1, s2):
    ids = prompt(next(_FRESH), 12)  # never seen before, whatever examples ran earlier
    assert gen(shared, ids, s1).num_cached_tokens == 0
    assert gen(shared, ids, s2).num_cached_tokens == (8 if s1 == s2 else 0)

"""Tenants inside the execution identity: a real server with two tenants' keys (docs/security.md).

Each test is a finding of the identity review, reproduced the way it was found (over HTTP, as a
hostile tenant) and failing on the code before the tenant entered the identity:

- bravo sending alpha's 64-token prompt got ``cached_tokens: 48``; now 0, in the pool and after
  eviction to the DRAM and disk tiers (``offloaded: 0``), and alpha still hits its own;
- bravo sending alpha's ``cache_salt`` got the same 48 tokens; now 0 (a salt narrows within a
  tenant, it never reaches another's);
- sharing is the operator's choice: tenants of one ``--shared-prefix-group`` hit each other;
- a session opened with a bad salt on a full server answered 500 after evicting another session;
  now 400 naming ``cache_salt``, with the other session untouched.
"""

from __future__ import annotations

import numpy as np
from security_helpers import KEY_A, KEY_B, http, keys_of, server

from execstate.identity.scope import CacheScope, PrefixSharing

BS = 16
KEY_C = "tenant-c-key-0003"


def prompt(seed: int, n: int = 64) -> list[int]:
    return np.random.default_rng(seed).integers(3, 500, n).tolist()


def complete(url: str, key: str, ids: list[int], salt: str | None = None) -> dict:
    body = {"model": "m", "prompt": ids, "max_tokens": 1, "temperature": 0}
    if salt is not None:
        body["cache_salt"] = salt
    r = http("POST", f"{url}/v1/completions", key, body)
    assert r.status_code == 200, r.text
    return r.json()["usage"]


def cached(usage: dict) -> int:
    return usage["prompt_tokens_details"]["cached_tokens"]


def test_another_tenant_never_hits_a_tenants_prompt_nor_its_salt(model_dir, tmp_path):
    keys = keys_of(tmp_path / "keys", alpha=KEY_A, bravo=KEY_B)
    with server(model_dir, engine_kw={"block_size": BS}, keys=keys) as s:
        ids = prompt(1)
        assert cached(complete(s.url, KEY_A, ids)) == 0
        assert cached(complete(s.url, KEY_A, ids)) == 48  # alpha's own repeat hits
        bravo = complete(s.url, KEY_B, ids)
        assert cached(bravo) == 0 and bravo["prompt_token_sources"]["local_cache"] == 0
        salted = prompt(2)
        assert cached(complete(s.url, KEY_A, salted, "alpha-secret")) == 0
        assert cached(complete(s.url, KEY_A, salted, "alpha-secret")) == 48
        assert cached(complete(s.url, KEY_B, salted, "alpha-secret")) == 0  # the salt is alpha's only
        assert cached(complete(s.url, KEY_B, salted, "alpha-secret")) == 48  # bravo's own salted copy


def test_evicted_units_come_back_for_their_tenant_only(model_dir, tmp_path):
    keys = keys_of(tmp_path / "keys", alpha=KEY_A, bravo=KEY_B, churner=KEY_C)
    engine_kw = {"block_size": BS, "num_kv_blocks": 24, "offload_dram_bytes": 8 << 20,
                 "offload_disk_dir": str(tmp_path / "disk")}
    with server(model_dir, engine_kw=engine_kw, keys=keys) as s:
        ids = prompt(3)
        complete(s.url, KEY_A, ids)
        alpha_keys = s.engine.call(lambda e: e.kv_manager.identity(CacheScope.build("alpha")).chain(ids, BS))
        seed = 100
        while s.engine.call(lambda e: any(e.block_pool.lookup(k) is not None for k in alpha_keys)):
            complete(s.url, KEY_C, prompt(seed))  # another tenant's traffic evicts alpha's blocks
            seed += 1
        assert s.engine.call(lambda e: e.offload.flush())
        bravo = complete(s.url, KEY_B, ids)
        assert bravo["prompt_token_sources"]["offloaded"] == 0 and cached(bravo) == 0
        alpha = complete(s.url, KEY_A, ids)
        assert alpha["prompt_token_sources"]["offloaded"] == len(ids) - 1  # the tier still serves its owner


def test_a_shared_prefix_group_is_the_operators_choice(model_dir, tmp_path):
    keys = keys_of(tmp_path / "keys", alpha=KEY_A, bravo=KEY_B, churner=KEY_C)
    sharing = PrefixSharing.parse(["common=alpha,bravo"])
    with server(model_dir, engine_kw={"block_size": BS}, keys=keys, sharing=sharing) as s:
        ids = prompt(4)
        complete(s.url, KEY_A, ids)
        assert cached(complete(s.url, KEY_B, ids)) == 48  # one group: one partition
        assert cached(complete(s.url, KEY_C, ids)) == 0  # not in the group


def test_a_bad_salt_is_refused_before_admission_and_evicts_nobody(model_dir, tmp_path):
    engine_kw = {"block_size": BS, "max_sessions": 1, "session_eviction": "lru"}
    with server(model_dir, engine_kw=engine_kw) as s:
        r = http("POST", f"{s.url}/v1/sessions", None, {"session_id": "a"})
        assert r.status_code == 200, r.text
        for bad in ("", "x" * 5000):
            r = http("POST", f"{s.url}/v1/sessions", None, {"session_id": "b", "cache_salt": bad})
            assert r.status_code == 400, (bad[:8], r.status_code, r.text)
            assert "cache_salt" in r.json()["error"]["message"]
        assert http("GET", f"{s.url}/v1/sessions/a").status_code == 200  # "a" was not evicted

"""Engines with offload tiers for the tier and hibernation tests (tests/engine/offload_helpers.py,
tests/session/hibernation_helpers.py): building one, prompts, a prompt's block keys, churning the
pool until given blocks left it, the end-of-test checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from execstate import LLM, SamplingParams
from execstate.engine.step_failure import check_references
from execstate.identity.keys import BlockKey, block_key
from execstate.identity.scope import CacheScope

BS = 16
CHURN = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


SHARED_SECRET = "tier-tests-shared-secret-0123456789"


def make(path: Path, num_kv_blocks: int, **kw) -> LLM:
    """An engine; a Redis tier gets the instances' shared secret (it refuses to start without one)."""
    if kw.get("offload_redis_url") is not None:
        kw.setdefault("offload_secret", SHARED_SECRET)
    kw.setdefault("enable_return_routed_experts", True)
    kw.setdefault("block_size", BS)
    kw.setdefault("seed", 0)
    return LLM(str(path), num_kv_blocks=num_kv_blocks, **kw)


def prompt(seed: int, n: int = 100) -> list[int]:
    return np.random.default_rng(seed).integers(3, 500, n).tolist()


def keys_of(llm: LLM, ids: list[int], salt: str | None = None) -> list[BlockKey]:
    """The keys of the prompt's full blocks under the engine's provenance (free routes)."""
    parent = llm.engine.kv_manager.identity(CacheScope.build(salt=salt)).root
    keys = []
    for i in range(len(ids) // BS):
        parent = block_key(parent, ids[i * BS : (i + 1) * BS])
        keys.append(parent)
    return keys


def slots_of(llm: LLM, keys: list[BlockKey]) -> list[int | None]:
    return [llm.engine.block_pool.lookup(k) for k in keys]


def churn(llm: LLM, keys: list[BlockKey], first_seed: int = 1000) -> None:
    """Run other prompts until none of ``keys`` is in the pool; then wait for the write-backs."""
    seed = first_seed
    while any(s is not None for s in slots_of(llm, keys)):
        llm.generate({"prompt_token_ids": prompt(seed)}, CHURN, use_tqdm=False)
        seed += 1
    if llm.engine.offload is not None:
        assert llm.engine.offload.flush()


def check_clean(llm: LLM, pool_empty: bool = True) -> None:
    """No slot left pinned by a write-back or a reload, the pool's books consistent, nothing
    running; ``pool_empty``: no block in use either (False where sessions still hold theirs)."""
    eng = llm.engine
    if eng.offload is not None:
        assert eng.offload.flush()
        assert eng.offload.host.num_pinned == 0
    eng.check_integrity()
    check_references(eng)
    assert not eng.has_unfinished_requests()
    if pool_empty:
        assert eng.block_pool.num_used == 0


def close(llm: LLM) -> None:
    llm.sessions.close_all()
    if llm.engine.offload is not None:
        llm.engine.offload.close()

"""Helpers for the hibernation tests: engines with tiers, prompts, pool churn, twin sessions."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from execstate import LLM, SamplingParams
from execstate.engine.step_failure import check_references
from execstate.identity.keys import BlockKey, block_key

BS = 16
POOL_BLOCKS = 32
SAMPLED = SamplingParams(temperature=0.9, top_p=0.95, seed=11, max_tokens=7, ignore_eos=True)
GREEDY = SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True)


def make(path: Path, **kw) -> LLM:
    kw.setdefault("enable_return_routed_experts", True)
    kw.setdefault("num_kv_blocks", POOL_BLOCKS)
    kw.setdefault("block_size", BS)
    kw.setdefault("seed", 0)
    return LLM(str(path), **kw)


def prompt(seed: int, n: int = 100) -> list[int]:
    return np.random.default_rng(seed).integers(3, 500, n).tolist()


def keys_of(llm: LLM, ids: list[int], salt: str | None = None) -> list[BlockKey]:
    parent = llm.engine.kv_manager.root_key("free", salt)
    keys = []
    for i in range(len(ids) // BS):
        parent = block_key(parent, ids[i * BS : (i + 1) * BS])
        keys.append(parent)
    return keys


def churn(llm: LLM, keys: list[BlockKey], first_seed: int = 1000) -> None:
    """Run other prompts until none of ``keys`` is in the pool; then wait for the write-backs."""
    seed = first_seed
    while any(llm.engine.block_pool.lookup(k) is not None for k in keys):
        llm.generate({"prompt_token_ids": prompt(seed)}, GREEDY, use_tqdm=False)
        seed += 1
    if llm.engine.offload is not None:
        assert llm.engine.offload.flush()


def same_step(got, want) -> None:
    assert got.token_ids == want.token_ids
    assert got.step_index == want.step_index
    if want.routed_experts is None:
        assert got.routed_experts is None
    else:
        assert got.routed_experts.tobytes() == want.routed_experts.tobytes()


def check_clean(llm: LLM) -> None:
    eng = llm.engine
    if eng.offload is not None:
        assert eng.offload.flush()
        assert eng.offload.host.num_pinned == 0
    eng.check_integrity()
    check_references(eng)
    assert not eng.has_unfinished_requests()


def close(llm: LLM) -> None:
    llm.sessions.close_all()
    if llm.engine.offload is not None:
        llm.engine.offload.close()

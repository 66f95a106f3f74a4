"""Helpers for the offload tier tests: engines with tiers, prompts, block keys, pool churn."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from execstate import LLM, SamplingParams
from execstate.engine.step_failure import check_references
from execstate.identity.keys import BlockKey, block_key

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
BS = 16
POOL_BLOCKS = 24  # 384 tokens: four 100-token prompts churn it


def make(path: Path, **kw) -> LLM:
    kw.setdefault("enable_return_routed_experts", True)
    kw.setdefault("num_kv_blocks", POOL_BLOCKS)
    kw.setdefault("block_size", BS)
    kw.setdefault("seed", 0)
    return LLM(str(path), **kw)


def prompt(seed: int, n: int = 100) -> list[int]:
    return np.random.default_rng(seed).integers(3, 500, n).tolist()


def run(llm: LLM, ids: list[int], params: SamplingParams = GREEDY, salt: str | None = None):
    p = {"prompt_token_ids": ids}
    if salt is not None:
        p["cache_salt"] = salt
    return llm.generate(p, params, use_tqdm=False)[0]


def keys_of(llm: LLM, ids: list[int], salt: str | None = None) -> list[BlockKey]:
    """The keys of the prompt's full blocks under the engine's provenance (free routes)."""
    parent = llm.engine.kv_manager.root_key("free", salt)
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
        run(llm, prompt(seed))
        seed += 1
    if llm.engine.offload is not None:
        assert llm.engine.offload.flush()


def same_output(got, want) -> None:
    """Identical tokens and routes (the oracle: the same prompt served cold)."""
    g, w = got.outputs[0], want.outputs[0]
    assert g.token_ids == w.token_ids
    if w.routed_experts is None:
        assert g.routed_experts is None
    else:
        assert g.routed_experts.shape == w.routed_experts.shape
        assert g.routed_experts.tobytes() == w.routed_experts.tobytes()


def check_clean(llm: LLM) -> None:
    eng = llm.engine
    if eng.offload is not None:
        assert eng.offload.flush()
        assert eng.offload.host.num_pinned == 0  # no slot left pinned by a write-back or a reload
    eng.check_integrity()
    check_references(eng)
    assert not eng.has_unfinished_requests()
    assert eng.block_pool.num_used == 0


def close(llm: LLM) -> None:
    if llm.engine.offload is not None:
        llm.engine.offload.close()

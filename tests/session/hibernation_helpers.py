"""Helpers for the hibernation tests: the shared tier engines (tests/tier_engines.py) with this
suite's pool size and sampling, the same-step oracle of twin sessions."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from tier_engines import BS, churn, close, keys_of, prompt
from tier_engines import check_clean as check_clean_pool
from tier_engines import make as make_with_pool

from execstate import LLM, SamplingParams

__all__ = ["BS", "GREEDY", "POOL_BLOCKS", "SAMPLED", "check_clean", "churn", "close", "keys_of", "make", "prompt",
           "same_step"]

POOL_BLOCKS = 32
SAMPLED = SamplingParams(temperature=0.9, top_p=0.95, seed=11, max_tokens=7, ignore_eos=True)
GREEDY = SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True)
check_clean = partial(check_clean_pool, pool_empty=False)  # live sessions hold their blocks


def make(path: Path, **kw) -> LLM:
    return make_with_pool(path, kw.pop("num_kv_blocks", POOL_BLOCKS), **kw)


def same_step(got, want) -> None:
    assert got.token_ids == want.token_ids
    assert got.step_index == want.step_index
    if want.routed_experts is None:
        assert got.routed_experts is None
    else:
        assert got.routed_experts.tobytes() == want.routed_experts.tobytes()

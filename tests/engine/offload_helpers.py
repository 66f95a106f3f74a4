"""Helpers for the offload tier tests: the shared tier engines (tests/tier_engines.py) with this
suite's pool size and sampling, a run, the same-output oracle."""

from __future__ import annotations

from pathlib import Path

from tier_engines import BS, check_clean, churn, close, keys_of, prompt, slots_of
from tier_engines import make as make_with_pool

from execstate import LLM, SamplingParams

__all__ = ["BS", "GREEDY", "POOL_BLOCKS", "check_clean", "churn", "close", "keys_of", "make", "prompt", "run",
           "same_output", "slots_of"]

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
POOL_BLOCKS = 24  # 384 tokens: four 100-token prompts churn it


def make(path: Path, **kw) -> LLM:
    return make_with_pool(path, kw.pop("num_kv_blocks", POOL_BLOCKS), **kw)


def run(llm: LLM, ids: list[int], params: SamplingParams = GREEDY, salt: str | None = None):
    p = {"prompt_token_ids": ids}
    if salt is not None:
        p["cache_salt"] = salt
    return llm.generate(p, params, use_tqdm=False)[0]


def same_output(got, want) -> None:
    """Identical tokens and routes (the oracle: the same prompt served cold)."""
    g, w = got.outputs[0], want.outputs[0]
    assert g.token_ids == w.token_ids
    if w.routed_experts is None:
        assert g.routed_experts is None
    else:
        assert g.routed_experts.shape == w.routed_experts.shape
        assert g.routed_experts.tobytes() == w.routed_experts.tobytes()

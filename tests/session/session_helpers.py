"""Helpers for the LM session tests: engines, prompts, and the block accounting check every test
ends with."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from execstate import LLM, SamplingParams
from execstate.engine.step_failure import check_references

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
SAMPLED = SamplingParams(temperature=0.8, max_tokens=8, ignore_eos=True, seed=1)


def make_llm(path: Path, **kw) -> LLM:
    kw.setdefault("enable_return_routed_experts", True)
    kw.setdefault("seed", 0)
    return LLM(str(path), **kw)


def tokens(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 500, n).tolist()


def generate(llm: LLM, ids: list[int], params: SamplingParams = GREEDY, max_tokens: int | None = None):
    if max_tokens is not None:
        params = replace(params, max_tokens=max_tokens)
    return llm.generate({"prompt_token_ids": ids}, params, use_tqdm=False)[0].outputs[0]


def check_accounting(llm: LLM) -> None:
    """Every block reference belongs to a request or a session/checkpoint hold."""
    eng = llm.engine
    eng.check_integrity()
    check_references(eng)


def check_released(llm: LLM) -> None:
    """After everything was closed: nothing held, nothing leaked."""
    check_accounting(llm)
    eng = llm.engine
    assert eng.kv_holds.num_holders == 0
    assert eng.block_pool.num_used == 0
    assert not eng.has_unfinished_requests()

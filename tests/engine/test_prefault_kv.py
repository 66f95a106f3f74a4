"""``prefault_kv``: the engine maps its KV pool's pages at start, in the background, and outputs
are unchanged (the mapping never changes contents)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from execstate import LLM, SamplingParams
from execstate.state.page_map import resident_pages


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE is Linux's")
def test_prefault_maps_the_pool_and_changes_no_token(moe_dir: Path) -> None:
    sp = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    prompt = {"prompt_token_ids": [5, 9, 2, 7, 11, 3, 8]}
    plain = LLM(str(moe_dir), num_kv_blocks=64, kernels="torch")
    assert plain.engine.kv_populate is None
    mapped = LLM(str(moe_dir), num_kv_blocks=64, kernels="torch", prefault_kv=True)
    mapped.engine.kv_populate.join(timeout=30)
    pool = mapped.engine.kv_pool
    nbytes = pool.k.numel() * pool.k.element_size()
    resident, total = resident_pages(pool.v.data_ptr(), nbytes)
    if resident < total:
        pytest.skip("kernel without MADV_POPULATE_WRITE (< 5.14)")
    want = plain.generate([prompt], sp, use_tqdm=False)[0].outputs[0].token_ids
    assert mapped.generate([prompt], sp, use_tqdm=False)[0].outputs[0].token_ids == want

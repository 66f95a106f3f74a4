"""Weight updates through the AsyncEngine: a command on the engine thread that never stops
other consumers' outputs; drain finishes the requests in flight on the old weights while
newer ones wait, abort delivers their final ``"abort"`` outputs."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from execstate import LLM
from execstate.engine.async_engine import AsyncEngine
from execstate.engine.config import EngineConfig
from execstate.engine.llm_engine import LLMEngine
from execstate.engine.sampling_params import SamplingParams
from execstate.model.loader import load_hf_state_dict

LONG = SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True)
SHORT = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
KW = {"enable_return_routed_experts": True, "block_size": 4, "max_model_len": 128}


def prompt(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 500, n).tolist()


@pytest.fixture()
def aengine(moe_dir):
    e = AsyncEngine(LLMEngine(EngineConfig(model=str(moe_dir), **KW)))
    yield e
    e.shutdown()


def reference(path, ids, params):
    return LLM(str(path), **KW).generate({"prompt_token_ids": ids}, params, use_tqdm=False)[0].outputs[0]


async def collect(engine: AsyncEngine, ids, params, rid, seen: list | None = None):
    last = None
    async for out in engine.generate({"prompt_token_ids": ids}, params, rid):
        last = out
        if seen is not None:
            seen.append(out)
    return last


def test_drain_keeps_streaming_and_newer_requests_wait(aengine, moe_dir, moe_dir_other_weights):
    old_ids, new_ids = prompt(1, 20), prompt(2, 20)
    new_sd = load_hf_state_dict(moe_dir_other_weights)

    async def main():
        seen_a: list = []
        a = asyncio.create_task(collect(aengine, old_ids, LONG, "a", seen_a))
        await asyncio.sleep(0)  # A's add is queued before the update
        update = asyncio.create_task(aengine.update_weights(new_sd, "v2", policy="drain"))
        await asyncio.sleep(0)
        b = asyncio.create_task(collect(aengine, new_ids, SHORT, "b"))
        await asyncio.sleep(0)
        state = await aengine.run_on_engine(
            lambda e: (e.weight_update is not None, [r.request_id for r in e.scheduler.waiting]))
        n_before = len(seen_a)
        result = await update
        streamed_during_drain = len(seen_a) - n_before
        return await a, await b, result, state, streamed_during_drain

    out_a, out_b, result, state, streamed = asyncio.run(main())
    assert state[0] and state[1][-1] == "b"  # commands ran during the drain; B waits (A may not have started)
    assert streamed > 10  # A's outputs kept flowing while the update waited for it
    assert (result.weights_version, result.policy, result.num_drained, result.num_aborted) == ("user:v2", "drain", 1, 0)
    ref_a = reference(moe_dir, old_ids, LONG)
    assert out_a.outputs[0].token_ids == ref_a.token_ids  # A: old weights throughout
    np.testing.assert_array_equal(out_a.outputs[0].routed_experts, ref_a.routed_experts)
    ref_b = reference(moe_dir_other_weights, new_ids, SHORT)
    assert out_b.outputs[0].token_ids == ref_b.token_ids  # B: new weights
    np.testing.assert_array_equal(out_b.outputs[0].routed_experts, ref_b.routed_experts)
    assert aengine.call(lambda e: (e.weight_update, e.block_pool.num_used)) == (None, 0)


def test_abort_delivers_abort_and_cached_prompt_misses_after(aengine, moe_dir_other_weights):
    ids = prompt(3, 24)

    async def main():
        warm = await collect(aengine, ids, SHORT, "warm")
        again = await collect(aengine, ids, SHORT, "again")
        victim = asyncio.create_task(collect(aengine, prompt(4, 20), LONG, "victim"))
        await asyncio.sleep(0)
        result = await aengine.update_weights(moe_dir_other_weights, policy="abort")  # a path, hashed
        after = await collect(aengine, ids, SHORT, "after")
        return warm, again, await victim, result, after

    warm, again, victim, result, after = asyncio.run(main())
    assert warm.num_cached_tokens == 0 and again.num_cached_tokens == 20
    assert victim.finished and victim.outputs[0].finish_reason == "abort"
    assert (result.policy, result.num_aborted) == ("abort", 1) and len(result.weights_version) == 64
    assert after.num_cached_tokens == 0
    ref = reference(moe_dir_other_weights, ids, SHORT)
    assert after.outputs[0].token_ids == ref.token_ids
    np.testing.assert_array_equal(after.outputs[0].routed_experts, ref.routed_experts)


def test_bad_update_raises_and_engine_serves_on(aengine, moe_dir, moe_dir_other_weights):
    sd = load_hf_state_dict(moe_dir_other_weights)
    del sd["model.norm.weight"]

    async def main():
        with pytest.raises(ValueError, match=r"model\.norm\.weight"):
            await aengine.update_weights(sd, "v2")
        with pytest.raises(ValueError, match="policy"):
            await aengine.update_weights(sd, "v2", policy="never")
        return await collect(aengine, prompt(5, 20), SHORT, "ok")

    out = asyncio.run(main())
    assert aengine.is_healthy
    assert out.outputs[0].token_ids == reference(moe_dir, prompt(5, 20), SHORT).token_ids

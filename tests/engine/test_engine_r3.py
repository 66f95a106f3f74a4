"""R3 contract of the engine (docs/contracts.md 4) on a tiny random Qwen3-MoE.

Oracles: Hugging Face transformers on the same weights (tokens and routes), a cold
engine vs a prefix-cached one, a roomy KV pool vs a tiny one that preempts.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from execstate import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=0)


def prompt(seed: int, n: int, vocab: int = 500) -> list[int]:
    return np.random.default_rng(seed).integers(3, vocab, n).tolist()


def llm(path, **kw) -> LLM:
    kw.setdefault("enable_return_routed_experts", True)
    kw.setdefault("block_size", 16)
    return LLM(str(path), **kw)


def hf_routes_and_tokens(path, ids: list[int], max_new: int):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        gen = hf.generate(torch.tensor([ids]), max_new_tokens=max_new, do_sample=False, min_new_tokens=max_new)
        full = gen[0].tolist()
        out = hf(gen[:, :-1], output_router_logits=True)
    k = hf.config.num_experts_per_tok
    probs = [torch.softmax(r.float(), -1) for r in out.router_logits]
    routes = np.stack([torch.topk(p, k, -1).indices.numpy() for p in probs], axis=1)
    return full[len(ids) :], routes


def test_tokens_and_routes_match_transformers(moe_dir):
    ids = prompt(0, 40)
    out = llm(moe_dir).generate({"prompt_token_ids": ids}, GREEDY, use_tqdm=False)[0]
    c = out.outputs[0]
    hf_tokens, hf_routes = hf_routes_and_tokens(moe_dir, ids, 12)
    assert c.token_ids == hf_tokens
    r = c.routed_experts
    assert r.dtype == np.int16 and r.shape == (40 + 12 - 1, *hf_routes.shape[1:])
    same = (np.sort(r, -1) == np.sort(hf_routes, -1)).all(-1).mean()
    assert same >= 0.999, f"expert sets agree on {same:.4%} of (token, layer) pairs"
    assert (np.sort(r, -1)[..., 1:] != np.sort(r, -1)[..., :-1]).all()  # no duplicates in a row


@pytest.mark.parametrize("shared_len", [32, 37])  # block-aligned and not
def test_prefix_hit_routes_byte_identical_to_cold(moe_dir, shared_len):
    shared = prompt(1, shared_len)
    p1, p2 = shared + prompt(2, 9), shared + prompt(3, 11)
    warm = llm(moe_dir)
    o1 = warm.generate({"prompt_token_ids": p1}, GREEDY, use_tqdm=False)[0]
    o2 = warm.generate({"prompt_token_ids": p2}, GREEDY, use_tqdm=False)[0]
    assert o1.num_cached_tokens == 0
    assert o2.num_cached_tokens == (shared_len // 16) * 16
    hit = o2.num_cached_tokens
    # The cached prefix's rows are the rows recorded when it was first computed.
    assert o2.outputs[0].routed_experts[:hit].tobytes() == o1.outputs[0].routed_experts[:hit].tobytes()
    cold = llm(moe_dir).generate({"prompt_token_ids": p2}, GREEDY, use_tqdm=False)[0]
    assert cold.num_cached_tokens == 0
    assert cold.outputs[0].token_ids == o2.outputs[0].token_ids
    assert cold.outputs[0].routed_experts.tobytes() == o2.outputs[0].routed_experts.tobytes()


def test_prompt_start_omission_is_the_tail(moe_dir):
    ids = prompt(4, 30)
    engine = llm(moe_dir)
    full = engine.generate({"prompt_token_ids": ids}, GREEDY, use_tqdm=False)[0].outputs[0]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, routed_experts_prompt_start=20)
    tail = engine.generate({"prompt_token_ids": ids}, params, use_tqdm=False)[0].outputs[0]
    np.testing.assert_array_equal(tail.routed_experts, full.routed_experts[20:])
    assert tail.routed_experts.shape[0] == 30 + 12 - 1 - 20


def test_preemption_under_tiny_pool_keeps_every_row(moe_dir):
    prompts = [{"prompt_token_ids": prompt(10 + i, 30)} for i in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    roomy = llm(moe_dir, block_size=4, max_model_len=64).generate(prompts, params, use_tqdm=False)
    tiny_llm = llm(moe_dir, block_size=4, max_model_len=64, num_kv_blocks=20)
    tiny = tiny_llm.generate(prompts, params, use_tqdm=False)
    assert tiny_llm.engine.scheduler.num_preemptions > 0
    for a, b in zip(roomy, tiny, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        ra, rb = a.outputs[0].routed_experts, b.outputs[0].routed_experts
        assert rb.shape == (30 + 20 - 1, *ra.shape[1:])
        np.testing.assert_array_equal(ra, rb)
    tiny_llm.engine.check_integrity()
    assert tiny_llm.engine.block_pool.num_used == 0


def test_weight_update_never_serves_old_state(moe_dir, moe_dir_other_weights):
    ids = prompt(5, 40)
    engine = llm(moe_dir)
    before = engine.generate({"prompt_token_ids": ids}, GREEDY, use_tqdm=False)[0]
    v1 = engine.weights_version
    # An in-flight request is aborted by the update; blocks stay consistent.
    engine.engine.add_request({"prompt_token_ids": prompt(6, 20)}, GREEDY, request_id="inflight")
    engine.engine.step()
    aborted = engine.update_weights(moe_dir_other_weights)
    assert [o.request_id for o in aborted] == ["inflight"]
    assert aborted[0].outputs[0].finish_reason == "abort"
    assert engine.weights_version != v1
    after = engine.generate({"prompt_token_ids": ids}, GREEDY, use_tqdm=False)[0]
    assert after.num_cached_tokens == 0  # same tokens, new weights: never a hit
    cold = llm(moe_dir_other_weights).generate({"prompt_token_ids": ids}, GREEDY, use_tqdm=False)[0]
    assert after.outputs[0].token_ids == cold.outputs[0].token_ids
    np.testing.assert_array_equal(after.outputs[0].routed_experts, cold.outputs[0].routed_experts)
    assert not np.array_equal(after.outputs[0].routed_experts, before.outputs[0].routed_experts)
    engine.engine.check_integrity()


def test_replay_reproduces_logprobs_and_forcing_changes_them(moe_dir):
    ids = prompt(7, 24)
    engine = llm(moe_dir)
    out = engine.generate({"prompt_token_ids": ids}, GREEDY, use_tqdm=False)[0].outputs[0]
    seq = ids + out.token_ids
    rollout_lp = np.array([lp[t].logprob for lp, t in zip(out.logprobs, out.token_ids, strict=True)])
    scored = engine.score(seq, routed_experts=out.routed_experts)
    got = np.array(scored.logprobs[len(ids) - 1 :])
    assert np.abs(got - rollout_lp).max() < 1e-4
    np.testing.assert_array_equal(scored.routed_experts, out.routed_experts)
    shifted = (out.routed_experts.astype(np.int64) + 1) % 8
    other = engine.score(seq, routed_experts=shifted)
    assert np.abs(np.array(other.logprobs) - np.array(scored.logprobs)).max() > 1e-3


def test_forced_routes_in_generation(moe_dir):
    ids = prompt(8, 20)
    engine = llm(moe_dir)
    free = engine.generate({"prompt_token_ids": ids}, GREEDY, use_tqdm=False)[0].outputs[0]
    forced_same = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, routed_experts=free.routed_experts)
    again = engine.generate({"prompt_token_ids": ids}, forced_same, use_tqdm=False)[0]
    assert again.num_cached_tokens == 0  # replayed units never share keys with free ones
    assert again.outputs[0].token_ids == free.token_ids
    np.testing.assert_array_equal(again.outputs[0].routed_experts, free.routed_experts)
    other = (free.routed_experts[:20].astype(np.int64) + 3) % 8
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, routed_experts=other)
    forced = engine.generate({"prompt_token_ids": ids}, params, use_tqdm=False)[0].outputs[0]
    np.testing.assert_array_equal(forced.routed_experts[:20], other)


def test_invalid_requests_raise_and_engine_keeps_serving(moe_dir):
    engine = llm(moe_dir, max_model_len=64)
    cases = [
        ({"prompt_token_ids": []}, None, "empty"),
        ({"prompt_token_ids": [1, 10**6]}, None, "outside the vocabulary"),
        ({"prompt_token_ids": [1] * 64}, None, "too long"),
        ({"prompt_token_ids": [1, 2, 3]}, SamplingParams(routed_experts=np.zeros((2, 5, 2), int)), "shape"),
        ({"prompt_token_ids": [1, 2, 3]}, SamplingParams(routed_experts=np.full((2, 2, 2), 99)), "outside"),
        ({"prompt_token_ids": [1, 2, 3]}, SamplingParams(routed_experts=np.ones((2, 2, 2), int)), "duplicate"),
    ]
    for p, sp, msg in cases:
        with pytest.raises(ValueError, match=msg):
            engine.generate(p, sp, use_tqdm=False)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=-1)
    # a bad prompt in a batch rejects the batch before anything runs
    with pytest.raises(ValueError):
        engine.generate([{"prompt_token_ids": [1, 2]}, {"prompt_token_ids": []}], use_tqdm=False)
    assert not engine.engine.has_unfinished_requests()
    ok = engine.generate({"prompt_token_ids": [1, 2, 3]}, GREEDY, use_tqdm=False)[0]
    assert len(ok.outputs[0].token_ids) == 12
    engine.engine.check_integrity()


def test_seeded_sampling_is_reproducible_across_batches(moe_dir):
    engine = llm(moe_dir)
    p = SamplingParams(temperature=0.8, top_p=0.9, top_k=50, seed=123, max_tokens=10, ignore_eos=True)
    alone = engine.generate({"prompt_token_ids": prompt(9, 10)}, p, use_tqdm=False)[0].outputs[0].token_ids
    batch = engine.generate(
        [{"prompt_token_ids": prompt(19, 14)}, {"prompt_token_ids": prompt(9, 10)}],
        [SamplingParams(temperature=1.0, max_tokens=5), p],
        use_tqdm=False,
    )
    assert batch[1].outputs[0].token_ids == alone


def test_stop_conditions(moe_dir):
    engine = llm(moe_dir)
    ids = prompt(11, 10)
    base = engine.generate({"prompt_token_ids": ids}, GREEDY, use_tqdm=False)[0].outputs[0]
    stop_tok = base.token_ids[3]
    p = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, stop_token_ids=[stop_tok])
    out = engine.generate({"prompt_token_ids": ids}, p, use_tqdm=False)[0].outputs[0]
    first = base.token_ids.index(stop_tok)
    assert out.token_ids == base.token_ids[: first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop_tok
    assert base.finish_reason == "length"
    n = engine.generate(
        {"prompt_token_ids": ids}, SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=4), use_tqdm=False
    )[0]
    assert [c.index for c in n.outputs] == [0, 1, 2]


def test_dense_model_has_no_routes(dense_dir):
    out = LLM(str(dense_dir), enable_return_routed_experts=True).generate(
        {"prompt_token_ids": prompt(12, 10)}, GREEDY, use_tqdm=False
    )[0]
    assert out.outputs[0].routed_experts is None
    assert len(out.outputs[0].token_ids) == 12


@pytest.mark.parametrize("kernels", ["torch", "auto"])
def test_bf16_engine_routes_are_consistent(moe_dir, kernels):
    """bf16 on torch ops: everything bf16; on the kernels: bf16 weights, fp32 activations and KV."""
    shared = prompt(13, 32)
    engine = llm(moe_dir, dtype="bfloat16", kernels=kernels)
    a = engine.generate({"prompt_token_ids": shared + [7, 8]}, GREEDY, use_tqdm=False)[0]
    b = engine.generate({"prompt_token_ids": shared + [9]}, GREEDY, use_tqdm=False)[0]
    bf16_weights = engine.engine.model.kernels
    assert engine.engine.kv_pool.k.dtype == (torch.float32 if bf16_weights else torch.bfloat16)
    assert engine.engine.model.layers[0].mlp.w_gate_up.dtype == torch.bfloat16
    assert b.num_cached_tokens == 32
    ra, rb = a.outputs[0].routed_experts, b.outputs[0].routed_experts
    assert ra.shape == (34 + 12 - 1, 2, 2) and rb.shape == (33 + 12 - 1, 2, 2)
    assert rb[:32].tobytes() == ra[:32].tobytes()
    assert ((ra >= 0) & (ra < 8)).all()

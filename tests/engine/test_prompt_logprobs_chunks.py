"""Prompt logprobs are scored chunk by chunk through the scheduler, like any prefill.

Before, ``echo`` and ``prompt_logprobs`` ran one dense forward pass over the whole prompt and one
``[n, vocab]`` log-softmax on the engine thread, between steps: a concurrent stream got no token
until it was over, and memory grew with the prompt (at 4k / 8k / 16k tokens: 28 / 33 / 110 s
without a token, +1.6 / 3.4 / 6.7 GB RSS; docs/bench_prompt_logprobs_before.json). Now a request
with ``SamplingParams.prompt_logprobs`` runs at most ``prompt_logprobs_chunk_tokens`` of its prompt
per step, its rows are reduced in blocks as they are computed, and the values are ``LLM.score``'s.

Here, on a random dense model with 2048 positions:

- the prompt logprobs of a 700-token prompt in 64-token chunks equal ``LLM.score`` bit for bit,
  and its ranks and top-k equal the dense log-softmax's (the scorer's own pass over the whole prompt);
- a decoding request beside it gets a token in every step while the prompt is scored, and the
  scoring request never runs more than its chunk in a step nor materialises more than
  ``ROWS_PER_BLOCK`` rows of logits at once;
- a preempted scoring request recomputes its prompt and gives the same values;
- such a request takes no prefix-cache hit, and its blocks are cached afterwards.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from execstate import LLM
from execstate.engine.config import EngineConfig
from execstate.engine.llm_engine import LLMEngine
from execstate.engine.prompt_logprobs import ROWS_PER_BLOCK
from execstate.engine.sampling_params import SamplingParams
from execstate.engine.scorer import _log_softmax
from execstate.kernels import cpu
from execstate.model.random_models import make_random

CHUNK = 64
K = 5


def same(got: list[float], want: list[float]) -> bool:
    """Bit for bit on execstate's CPU kernels (a row is computed the same way in any chunk); within
    fp32 rounding on torch ops, whose matmuls may block a chunk differently."""
    return got == want if cpu.available() else bool(np.allclose(got, want, rtol=0, atol=1e-5))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_random("qwen3", tmp_path_factory.mktemp("scoring"), seed=3, max_position_embeddings=2048)


@pytest.fixture(scope="module")
def prompt():
    return [int(t) for t in np.random.default_rng(0).integers(3, 512, 700)]


def engine(model_dir, **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(model_dir), seed=0, prompt_logprobs_chunk_tokens=CHUNK, **kw))


def scored(eng: LLMEngine, prompt: list[int], k: int = K):
    rid = eng.add_request(prompt, SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=k))
    while True:
        for out in eng.step():
            if out.request_id == rid and out.finished:
                return out


def test_chunked_prompt_logprobs_equal_the_dense_pass(model_dir, prompt):
    eng = engine(model_dir)
    out = scored(eng, prompt)
    plp = out.prompt_logprobs
    assert plp is not None and len(plp) == len(prompt) and plp.top_ids.shape == (len(prompt) - 1, K)
    ref = LLM(str(model_dir), seed=0).score(prompt)
    assert same(plp.logprobs.tolist(), ref.logprobs)
    logp, _ = _log_softmax(eng, prompt, None)  # the dense pass over the whole prompt: the oracle
    own = logp.gather(1, torch.tensor(prompt[1:])[:, None])
    assert plp.ranks.tolist() == ((logp > own).sum(dim=1) + 1).tolist()
    top_v, top_i = torch.topk(logp, K, dim=1)
    assert plp.top_ids.tolist() == top_i.tolist()
    assert same(plp.top_logprobs.ravel().tolist(), top_v.ravel().tolist())
    entries = plp.entries()
    assert entries[0] is None and same([entries[5][prompt[5]].logprob], [ref.logprobs[4]])
    assert {lp.rank for t, lp in entries[5].items() if t != prompt[5] or lp.rank <= K} >= set(range(1, K + 1))


def test_a_stream_beside_it_gets_a_token_every_step(model_dir, prompt):
    eng = engine(model_dir)
    stream = eng.add_request([5, 6, 7], SamplingParams(max_tokens=200, temperature=0, ignore_eos=True))
    eng.step()  # the stream's prefill
    widest: list[int] = []
    original = eng.model.compute_logits
    eng.model.compute_logits = lambda h: widest.append(h.shape[0]) or original(h)  # type: ignore[method-assign]
    rid = eng.add_request(prompt, SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=K))
    steps = 0
    while True:
        outs = {o.request_id: o for o in eng.step()}
        steps += 1
        assert stream in outs, f"step {steps}: the stream got no token while the prompt was scored"
        if rid in outs and outs[rid].finished:
            break
    assert steps >= len(prompt) // CHUNK  # the prompt took many steps, one chunk each
    assert max(widest) <= ROWS_PER_BLOCK  # logits rows materialised at once
    assert outs[rid].prompt_logprobs is not None


def test_at_most_one_chunk_per_step(model_dir, prompt):
    eng = engine(model_dir)
    rid = eng.add_request(prompt, SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0))
    req = eng.requests[rid]
    done = []
    while not req.is_finished:
        before = req.num_computed_tokens
        eng.step()
        done.append(req.num_computed_tokens - before if not req.is_finished else None)
    assert all(d is None or 0 < d <= CHUNK for d in done), done
    assert len(done) == -(-len(prompt) // CHUNK)


def test_preempted_scoring_recomputes_the_same_values(model_dir, prompt):
    ref = scored(engine(model_dir), prompt).prompt_logprobs
    eng = engine(model_dir)
    rid = eng.add_request(prompt, SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=K))
    eng.step()
    eng.step()  # two chunks in
    req = eng.requests[rid]
    assert 0 < req.num_computed_tokens < len(prompt)
    eng.scheduler.running.remove(req)
    eng.scheduler._preempt(req)  # what the scheduler does when the pool runs dry
    assert req.num_computed_tokens == 0
    while not req.is_finished:
        outs = eng.step()
    out = next(o for o in outs if o.request_id == rid)
    assert same(out.prompt_logprobs.logprobs.tolist(), ref.logprobs.tolist())
    assert out.prompt_logprobs.top_ids.tolist() == ref.top_ids.tolist()


def test_no_prefix_hit_but_its_blocks_are_cached(model_dir, prompt):
    eng = engine(model_dir)
    eng.add_request(prompt, SamplingParams(max_tokens=1, temperature=0))
    while eng.has_unfinished_requests():
        eng.step()
    out = scored(eng, prompt)  # the same prompt, now in the cache: scored anyway, from position 0
    assert out.num_cached_tokens == 0 and out.prompt_logprobs is not None
    rid = eng.add_request(prompt, SamplingParams(max_tokens=1, temperature=0))
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.request_id == rid and o.finished:
                assert o.num_cached_tokens == (len(prompt) - 1) // 16 * 16  # a plain request hits it
    eng.check_integrity()
    assert eng.block_pool.num_used == 0


def test_bad_values_are_refused_before_the_engine(model_dir):
    eng = engine(model_dir)
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="prompt_logprobs"):
            eng.add_request([5, 6, 7], SamplingParams(max_tokens=1, prompt_logprobs=bad))
    with pytest.raises(ValueError, match="prompt_logprobs"):
        eng.add_request([5, 6, 7], SamplingParams(max_tokens=1, prompt_logprobs=10**6))
    assert not eng.requests


def test_the_torch_path_scores_too(model_dir, prompt):
    """On torch's ops (the device runner: ``kernels="torch"``, the GPU path's code on the CPU) the
    same chunks give ``LLM.score``'s values within fp32 rounding (torch's GEMMs round differently
    with the number of rows)."""
    eng = engine(model_dir, kernels="torch")
    out = scored(eng, prompt)
    ref = LLM(str(model_dir), seed=0, kernels="torch").score(prompt)
    assert np.allclose(out.prompt_logprobs.logprobs, ref.logprobs, atol=1e-4)
    assert out.prompt_logprobs.top_ids.shape == (len(prompt) - 1, K)

"""Part 1 of the tour: an R3 rollout on the embedded MoE with prefix reuse and replay.

1. Rollout: greedy answers to chat prompts that share a long system prompt, with
   route return on. The first prompt computes the shared prefix; the others hit it in
   the prefix cache (``num_cached_tokens``) and get its route rows from the cache.
2. Checks the R3 contract: each routes array has ``num_tokens - 1`` rows, the cached
   prefix's rows equal the rows recorded when it was first computed.
3. Replay: each rollout is scored with its own routes; the logprobs reproduce the
   rollout's sampled-token logprobs.
"""

from __future__ import annotations

import time

import numpy as np

from execstate import LLM, SamplingParams
from execstate.model.registry import resolve_model

SYSTEM = (
    "You are a concise assistant for a geography quiz. Answer every question with one short, "
    "correct sentence. Do not add explanations, lists or follow-up questions."
)
QUESTIONS = [
    "What is the capital of France?",
    "What is the capital of Germany?",
    "What is the capital of Italy?",
    "What is the largest ocean on Earth?",
]


def run_r3(model: str = "smollm2-moe") -> bool:
    t0 = time.perf_counter()
    # First run only: build the embedded model (progress on stderr) before the engine, so the
    # "engine start" printed below is the warm start.
    resolve_model(model)
    llm = LLM(model=model, enable_return_routed_experts=True, seed=0, max_model_len=2048)
    eng = llm.engine
    mc = eng.model_config
    print(f"model {model}: {mc.architecture}, {mc.num_layers} layers, {mc.num_moe_layers} MoE layers, "
          f"{mc.num_experts} experts top-{mc.top_k}; engine start {eng.startup_seconds:.2f} s")
    print(f"weights version {llm.weights_version[:16]}…")
    params = SamplingParams(temperature=0.0, max_tokens=24, logprobs=0)
    convs = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}] for q in QUESTIONS]
    first = llm.chat(convs[0], params, use_tqdm=False)[0]
    rest = llm.chat(convs[1:], params, use_tqdm=False)
    outs = [first, *rest]
    ok = True
    for q, o in zip(QUESTIONS, outs, strict=True):
        c = o.outputs[0]
        n_tokens = len(o.prompt_token_ids) + len(c.token_ids)
        shape_ok = c.routed_experts is not None and c.routed_experts.shape == (
            n_tokens - 1,
            mc.num_moe_layers,
            mc.top_k,
        )
        ok &= shape_ok
        print(f"\nQ: {q}\nA: {c.text.strip()}")
        print(f"   prompt {len(o.prompt_token_ids)} tokens, cached {o.num_cached_tokens}, "
              f"routed_experts {None if c.routed_experts is None else c.routed_experts.shape} "
              f"{'ok' if shape_ok else 'WRONG SHAPE'}")
    # Cached prefix rows must be the rows recorded when the prefix was first computed.
    for o in rest:
        n = o.num_cached_tokens
        same = np.array_equal(o.outputs[0].routed_experts[:n], first.outputs[0].routed_experts[:n])
        ok &= same and n > 0
    print(f"\nprefix-cache hits: {[o.num_cached_tokens for o in outs]} tokens; hit rate "
          f"{eng.kv_manager.prefix_hit_rate:.1%}; cached rows identical to first computation: {ok}")
    # Replay: score each rollout with its own routes.
    worst = 0.0
    for o in outs:
        c = o.outputs[0]
        seq = o.prompt_token_ids + c.token_ids
        scored = llm.score(seq, routed_experts=c.routed_experts)
        got = np.array(scored.logprobs[len(o.prompt_token_ids) - 1 :])
        want = np.array([lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids, strict=True)])
        worst = max(worst, float(np.abs(got - want).max()))
        ok &= np.array_equal(scored.routed_experts, c.routed_experts)
    ok &= worst < 1e-3
    print(f"replay: scoring each rollout with its own routes reproduces its logprobs "
          f"(max abs diff {worst:.2e}); replayed routes identical: {ok}")
    print(f"R3 part {'passed' if ok else 'FAILED'} in {time.perf_counter() - t0:.1f} s")
    return bool(ok)

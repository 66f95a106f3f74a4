"""Teacher-forced scoring of a token sequence, optionally replaying MoE routes.

One dense causal forward pass over the whole sequence (no KV cache, no scheduler).
With ``routed_experts`` given, row i forces the experts of the forward pass over
token i; combine weights still come from the live router.

Bitwise replay: on execstate's CPU kernels (every numerics mode but the torch-only
``eager``), scoring a finished rollout (prompt + generated tokens) with its own routes
reproduces the rollout's logprobs exactly (compare with ``==``). Every kernel computes a
token's row with the same operations whatever the step, batch or chunk it is in, and the
attention here is the engine's paged kernel over the sequence's own K/V
(``model/replay_attention.py``), so the one-pass prefill gives each row the bits the
token-by-token decode gave it (tests/engine/test_bitwise_replay.py). The same holds on the
torch path in its deterministic mode (``deterministic=True``: batch-invariant Triton kernels, the
attention the engine's paged Triton kernel over the sequence's own K/V; ``model/gpu_path.py``,
tests/gpu/test_deterministic_replay.py). Otherwise, on torch's ops (``kernels="torch"``) the two
differ by rounding (~1e-6 in fp32): torch's GEMMs and SDPA round differently with the number of rows.

vLLM's ``prompt_logprobs`` (and the OpenAI API's ``echo`` logprobs) are not computed here: they are
scored chunk by chunk as a request's prompt is prefilled (``engine/prompt_logprobs.py``), with the
same log-softmax of the same rows, so on the CPU kernels they equal ``score_tokens``' bit for bit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from execstate.engine.outputs import ScoreOutput
from execstate.engine.validation import validate_forced_routes, validate_prompt
from execstate.model.context import AttentionBackend, RouteCapture, StepContext
from execstate.model.dense_attention import DenseCausalAttention
from execstate.model.device.attention import TritonCausalAttention
from execstate.model.replay_attention import KernelCausalAttention

if TYPE_CHECKING:
    from execstate.engine.llm_engine import LLMEngine


@torch.inference_mode()
def score_tokens(engine: LLMEngine, token_ids: list[int], routed_experts: np.ndarray | None = None) -> ScoreOutput:
    token_ids = [int(t) for t in token_ids]
    logp, rows = _log_softmax(engine, token_ids, routed_experts)
    chosen = logp.gather(1, torch.tensor(token_ids[1:], device=logp.device)[:, None]).squeeze(1)
    return ScoreOutput(token_ids, chosen.cpu().tolist(), rows)


def _log_softmax(engine: LLMEngine, token_ids: list[int],
                 routed_experts: np.ndarray | None) -> tuple[torch.Tensor, np.ndarray | None]:
    """log-softmax of the logits at positions 0..n-2 ([n-1, vocab], fp32) and the route rows."""
    mc = engine.model_config
    if len(token_ids) < 2:
        raise ValueError("score needs at least two tokens")
    validate_prompt(token_ids[:-1], mc.vocab_size, engine.max_model_len)
    validate_prompt(token_ids[-1:], mc.vocab_size, engine.max_model_len)
    n = len(token_ids)
    dev = engine.config.device
    forced_ids = forced_mask = None
    if routed_experts is not None:
        arr = validate_forced_routes(
            routed_experts, mc.num_moe_layers if mc.is_moe else 0, mc.top_k or 0, mc.num_experts or 0, n
        )
        forced_ids = torch.zeros((n, mc.num_moe_layers, mc.top_k), dtype=torch.long)
        forced_ids[: len(arr)] = torch.from_numpy(arr)
        forced_mask = torch.zeros(n, dtype=torch.bool)
        forced_mask[: len(arr)] = True
        forced_ids, forced_mask = forced_ids.to(dev), forced_mask.to(dev)
    routes = RouteCapture(n, mc.num_moe_layers, mc.top_k, forced_ids, forced_mask, device=dev) if mc.is_moe else None
    ids = torch.tensor(token_ids, dtype=torch.long, device=dev)
    positions = torch.arange(n, device=dev)
    kv_dtype = engine.kv_pool.k.dtype
    kernels = engine.model.kernels and kv_dtype in (torch.float32, torch.bfloat16)
    attention: AttentionBackend
    if kernels:
        attention = KernelCausalAttention(n, kv_dtype)
    elif engine.runner.device_runner.triton:  # the engine's own attention kernel (bitwise in deterministic mode)
        attention = TritonCausalAttention(n, ids.device)
    else:
        attention = DenseCausalAttention()
    with StepContext(positions, attention, routes) as ctx:
        hidden = engine.model(ids, ctx)
    logits = engine.model.compute_logits(hidden[:-1]).float()
    rows = routes.ids[: n - 1].cpu().numpy().copy() if routes is not None else None
    return torch.log_softmax(logits, dim=-1), rows

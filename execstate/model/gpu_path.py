"""Which kernels the torch path runs, and the deterministic (batch-invariant) mode.

``use_gpu_kernels(model, triton, deterministic)`` switches a torch-ops ``CausalLM``:

- ``triton``: the MoE experts' grouped GEMM runs in Triton (``kernels/gpu/grouped_mm.py``); the
  engine's attention backend takes the Triton paged kernel (``engine/device_runner.py``);
- ``deterministic`` (needs ``triton``): every op whose result could depend on the other rows of
  its launch runs a row-invariant kernel: each ``Linear`` and the LM head on the one-group
  grouped GEMM (fixed tiles, no split-K), each RMSNorm and the router's softmax on the
  one-program-per-row kernels (``kernels/gpu/rows.py``). Attention (one program per query row)
  and the MoE experts (grouped GEMM, a fixed-order sum over the k experts) are row-invariant
  already; elementwise ops (RoPE, SwiGLU, residual adds) and gathers are by nature.

So in the deterministic mode a token's logits, routes and logprob are the same bits whatever its
batch, its chunk, a prefix hit or prefill vs decode, and scoring a rollout with its own routes
(``LLM.score``) reproduces its logprobs bit for bit on a GPU, as the C kernels do on the CPU.
It costs the speed of cuBLAS's shape-tuned GEMMs (``docs/performance.md``). The kernel family
(``kernels/family.kernel_family``) names the mode, so its KV never mixes with another's.
"""

from __future__ import annotations

from execstate.model.layers import Linear, RMSNorm
from execstate.model.moe import SparseMoE
from execstate.model.transformer import CausalLM


def use_gpu_kernels(model: CausalLM, triton: bool, deterministic: bool) -> None:
    """Switch ``model`` (on torch ops, not the CPU kernels) as the module docstring says.
    ``ValueError`` for the deterministic mode without Triton or a model on the CPU kernels."""
    if deterministic and not triton:
        raise ValueError("the deterministic mode needs the Triton kernels")
    if model.kernels and (triton or deterministic):
        raise ValueError("the GPU kernels are for a model on torch ops, not on execstate's CPU kernels")
    for module in model.modules():
        if isinstance(module, SparseMoE):
            module.triton = triton
            module.batch_invariant = deterministic
        elif isinstance(module, (Linear, RMSNorm)):
            module.batch_invariant = deterministic
    model.batch_invariant = deterministic

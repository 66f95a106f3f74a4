"""MoE routing on the kernels (C: ``route``, ``csrc/decode_moe.c``): what ``SparseMoE.route`` computes,
in one fixed order that the whole-layer decode call shares.

``route(logits [T, E], k, norm_topk, forced) -> (ids int64 [T, k], weights fp32 [T, k])``:
softmax over the experts (max subtracted, the kernels' exp, the sum in expert order), the k
largest in descending order (the lower expert id first among equal probabilities), replayed rows
(``forced``: mask ``[T]``, ids ``[T, k]``) take their forced ids and those ids' probabilities, and
with ``norm_topk`` the k weights are divided by their sum. Per row, so batch-invariant; its
rounding differs from ``torch.softmax``'s, so the kernel sets that use it have their own numerics
id. A forced id outside ``[0, E)`` is a ``ValueError``.
"""

from __future__ import annotations

import torch

from execstate.kernels.ext import available, is_f32_cpu, lib, require


def use_route(logits: torch.Tensor) -> bool:
    """Whether ``route`` takes these logits (2-D fp32 contiguous on the CPU, the kernels built)."""
    return available() and logits.dim() == 2 and is_f32_cpu(logits) and logits.shape[1] >= 1


def route(logits: torch.Tensor, k: int, norm_topk: bool,
          forced: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    require(logits, "logits", 2)
    t, e = logits.shape
    if not 1 <= k <= e:
        raise ValueError(f"route: k = {k} for {e} experts")
    ids = torch.empty((t, k), dtype=torch.int64)
    weights = torch.empty((t, k), dtype=torch.float32)
    mask_ptr = forced_ptr = 0
    if forced is not None:
        mask = forced[0].to(device="cpu", dtype=torch.uint8).contiguous()
        fids = forced[1].to(device="cpu", dtype=torch.int64).contiguous()
        if tuple(mask.shape) != (t,) or tuple(fids.shape) != (t, k):
            raise ValueError(f"route: forced mask {tuple(mask.shape)} / ids {tuple(fids.shape)} for {t} rows of {k}")
        mask_ptr, forced_ptr = mask.data_ptr(), fids.data_ptr()
    if t:
        lib().route(logits.data_ptr(), t, e, k, forced_ptr, mask_ptr, int(norm_topk), ids.data_ptr(),
                    weights.data_ptr())
    return ids, weights


__all__ = ["route", "use_route"]

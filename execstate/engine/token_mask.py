"""Allowed-token masks for some rows of a step's logits (constrained decoding), applied vectorised.

A :class:`TokenMask` names the logits rows it constrains (``rows``, int64) and holds one bitmask
per row (``bits``, int32 ``[len(rows), ceil(vocab / 32)]``: bit ``t % 32`` of word ``t // 32`` set
when token ``t`` is allowed; llguidance's layout). ``apply_token_mask`` sets the disallowed logits
of those rows to ``-inf`` with tensor ops over the constrained rows only: rows without a mask are
not touched, and a step without one does not call it. A row that the mask and the request's own
bans (``min_tokens``) together leave empty keeps the mask alone (the grammar decides; a sample
from an empty row would be meaningless).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from execstate.kernels import ext

_SHIFTS = torch.arange(32, dtype=torch.int32)


def _kernel_takes(x: torch.Tensor, mask: TokenMask, fallback: torch.Tensor | None) -> bool:
    return (ext.LIB is not None and x.dim() == 2 and ext.is_f32_cpu(x) and mask.rows.dtype == torch.int64
            and mask.bits.dtype == torch.int32 and mask.bits.is_contiguous() and mask.bits.dim() == 2
            and mask.bits.shape[0] == mask.rows.numel() and mask.bits.shape[1] * 32 >= x.shape[1]
            and (fallback is None or (ext.is_f32_cpu(fallback) and fallback.shape == x.shape)))


@dataclass(frozen=True)
class TokenMask:
    rows: torch.Tensor  # int64 [k]: logits rows this mask constrains
    bits: torch.Tensor  # int32 [k, ceil(vocab / 32)]


class DeferredMask(Protocol):
    def settle(self, x: torch.Tensor, fallback: torch.Tensor, tokens: torch.Tensor) -> None:
        """``tokens`` (int64 ``[rows]``, each row's argmax of ``x``, ``[rows, vocab]`` on the host)
        become, in the rows this stands for, the argmax of ``x`` under the row's mask as
        ``apply_token_mask(x, mask, fallback)`` would make it; ``x`` and ``fallback`` unchanged."""


def allowed(mask: TokenMask, vocab: int) -> torch.Tensor:
    """bool ``[k, vocab]``: which tokens each constrained row allows."""
    k = mask.bits.shape[0]
    return ((mask.bits.unsqueeze(-1) >> _SHIFTS.to(mask.bits.device)) & 1).bool().view(k, -1)[:, :vocab]


def apply_token_mask(x: torch.Tensor, mask: TokenMask, fallback: torch.Tensor | None = None) -> None:
    """Disallowed tokens of the masked rows of ``x`` ([rows, vocab], in place) become ``-inf``.
    ``fallback`` ([rows, vocab]): the logits to mask instead for a row left with nothing allowed.
    On the CPU kernels one pass per row in C (``kernels/csrc/token_mask.c``, the same values),
    else torch ops over the unpacked mask (on the logits' device)."""
    if _kernel_takes(x, mask, fallback):
        lib, (n, vocab) = ext.LIB, x.shape
        rows = mask.rows.contiguous()
        if rows.numel() and not (int(rows.min()) >= 0 and int(rows.max()) < n):
            raise ValueError(f"apply_token_mask: a masked row lies outside [0, {n})")
        lib.mask_logits(x.data_ptr(), 0 if fallback is None else fallback.data_ptr(), rows.data_ptr(), rows.numel(),
                        mask.bits.data_ptr(), mask.bits.shape[1], vocab)
        return
    if mask.rows.device != x.device:  # the grammar worker builds masks on the host
        mask = TokenMask(mask.rows.to(x.device, non_blocking=True), mask.bits.to(x.device, non_blocking=True))
    ok = allowed(mask, x.shape[1])
    sub = x.index_select(0, mask.rows).masked_fill_(~ok, float("-inf"))
    if fallback is not None:  # no read-back: the fallback rows are computed and selected on the device
        empty = torch.isneginf(sub).all(dim=-1)
        alt = fallback.index_select(0, mask.rows).masked_fill_(~ok, float("-inf"))
        sub = torch.where(empty[:, None], alt, sub)
    x.index_copy_(0, mask.rows, sub)

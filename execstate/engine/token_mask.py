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

import torch

_SHIFTS = torch.arange(32, dtype=torch.int32)


@dataclass(frozen=True)
class TokenMask:
    rows: torch.Tensor  # int64 [k]: logits rows this mask constrains
    bits: torch.Tensor  # int32 [k, ceil(vocab / 32)]


def allowed(mask: TokenMask, vocab: int) -> torch.Tensor:
    """bool ``[k, vocab]``: which tokens each constrained row allows."""
    k = mask.bits.shape[0]
    return ((mask.bits.unsqueeze(-1) >> _SHIFTS.to(mask.bits.device)) & 1).bool().view(k, -1)[:, :vocab]


def apply_token_mask(x: torch.Tensor, mask: TokenMask, fallback: torch.Tensor | None = None) -> None:
    """Disallowed tokens of the masked rows of ``x`` ([rows, vocab], in place) become ``-inf``.
    ``fallback`` ([rows, vocab]): the logits to mask instead for a row left with nothing allowed."""
    if mask.rows.device != x.device:  # the grammar worker builds masks on the host
        mask = TokenMask(mask.rows.to(x.device, non_blocking=True), mask.bits.to(x.device, non_blocking=True))
    ok = allowed(mask, x.shape[1])
    sub = x.index_select(0, mask.rows).masked_fill_(~ok, float("-inf"))
    if fallback is not None:  # no read-back: the fallback rows are computed and selected on the device
        empty = torch.isneginf(sub).all(dim=-1)
        alt = fallback.index_select(0, mask.rows).masked_fill_(~ok, float("-inf"))
        sub = torch.where(empty[:, None], alt, sub)
    x.index_copy_(0, mask.rows, sub)

"""Checks applied to every request before it can touch engine state.

Each failure raises ``ValueError`` with a message naming the problem; the engine
stays untouched and keeps serving other requests.
"""

from __future__ import annotations

import numpy as np


def validate_prompt(token_ids: list[int], vocab_size: int, max_model_len: int) -> None:
    if len(token_ids) == 0:
        raise ValueError("prompt is empty: at least one token is required")
    bad = [t for t in token_ids if not isinstance(t, int | np.integer) or t < 0 or t >= vocab_size]
    if bad:
        raise ValueError(
            f"prompt has {len(bad)} token id(s) outside the vocabulary [0, {vocab_size}), e.g. {bad[0]!r}"
        )
    if len(token_ids) >= max_model_len:
        raise ValueError(
            f"prompt is too long: {len(token_ids)} tokens, but max_model_len is {max_model_len} "
            "(the prompt plus at least one generated token must fit)"
        )


def validate_forced_routes(
    routes: np.ndarray, num_moe_layers: int, top_k: int, num_experts: int, max_rows: int
) -> np.ndarray:
    """Validate routes to replay; returns them as a contiguous int64 array."""
    if num_moe_layers == 0:
        raise ValueError("routed_experts given, but the model has no MoE layers")
    arr = np.asarray(routes)
    if arr.ndim != 3 or arr.shape[1:] != (num_moe_layers, top_k):
        raise ValueError(
            f"routed_experts has shape {arr.shape}, expected [tokens, {num_moe_layers}, {top_k}] "
            "(n_moe_layers, top_k of this model)"
        )
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"routed_experts must hold integers, got dtype {arr.dtype}")
    if len(arr) > max_rows:
        raise ValueError(f"routed_experts has {len(arr)} rows, more than the {max_rows} tokens it can route")
    if arr.size and (arr.min() < 0 or arr.max() >= num_experts):
        raise ValueError(f"routed_experts has expert ids outside [0, {num_experts})")
    if top_k > 1 and len(arr):
        s = np.sort(arr, axis=-1)
        dup = (s[..., 1:] == s[..., :-1]).any(axis=-1)
        if dup.any():
            tok, layer = map(int, np.argwhere(dup)[0])
            raise ValueError(f"routed_experts has a duplicate expert in row (token {tok}, moe layer {layer})")
    return np.ascontiguousarray(arr, dtype=np.int64)


def validate_logit_bias(logit_bias: dict[int, float] | None, vocab_size: int) -> None:
    """Every ``logit_bias`` key must be a token id inside the vocabulary."""
    if not logit_bias:
        return
    bad = [t for t in logit_bias if t < 0 or t >= vocab_size]
    if bad:
        raise ValueError(
            f"invalid sampling parameter logit_bias: token id {bad[0]} is outside the vocabulary [0, {vocab_size})"
        )

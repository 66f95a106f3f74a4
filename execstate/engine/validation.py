"""Checks applied to every request before it can touch engine state.

Each failure raises ``ValueError`` with a message naming the problem; the engine
stays untouched and keeps serving other requests.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from execstate.engine.grammar.bounds import GrammarBounds, check_bounds

if TYPE_CHECKING:
    from execstate.engine.grammar.spec import StructuredOutputsParams
    from execstate.engine.sampling_params import SamplingParams

# torch.Generator.manual_seed accepts exactly this range.
SEED_RANGE = (-(2**63), 2**64)


def check_prompt_length(num_tokens: int, max_model_len: int) -> None:
    if num_tokens >= max_model_len:
        raise ValueError(
            f"prompt is too long: {num_tokens} tokens, but max_model_len is {max_model_len} "
            "(the prompt plus at least one generated token must fit)"
        )


def validate_prompt(token_ids: list[int], vocab_size: int, max_model_len: int) -> None:
    if len(token_ids) == 0:
        raise ValueError("prompt is empty: at least one token is required")
    check_prompt_length(len(token_ids), max_model_len)  # first: bounds the scan below
    # plain ints (the usual prompt): the type set, min and max in C instead of a Python test per token
    if set(map(type, token_ids)) == {int} and min(token_ids) >= 0 and max(token_ids) < vocab_size:
        return
    bad = [t for t in token_ids if not isinstance(t, int | np.integer) or t < 0 or t >= vocab_size]
    if bad:
        raise ValueError(
            f"prompt has {len(bad)} token id(s) outside the vocabulary [0, {vocab_size}), e.g. {bad[0]!r}"
        )


def validate_sampling(params: SamplingParams, vocab_size: int) -> None:
    """What ``SamplingParams`` cannot check on its own because it needs the model: every
    id it names inside the vocabulary, and values the sampler could not survive."""

    def bad(name: str, why: str) -> ValueError:
        return ValueError(f"invalid sampling parameter {name}: {why}")

    if params.n < 1:
        raise bad("n", f"must be an integer >= 1, got {params.n!r}")
    stop_ids = params.stop_token_ids or []
    outside = [t for t in stop_ids if not 0 <= t < vocab_size]
    if outside:
        raise bad("stop_token_ids", f"{outside[0]!r} is outside the vocabulary [0, {vocab_size})")
    for name in ("logprobs", "prompt_logprobs"):
        v = getattr(params, name)
        if v is not None and v > vocab_size:
            raise bad(name, f"must be <= the vocabulary size {vocab_size}, got {v!r}")
    if not math.isfinite(params.temperature):
        raise bad("temperature", f"must be finite, got {params.temperature!r}")
    if params.seed is not None and not SEED_RANGE[0] <= params.seed < SEED_RANGE[1]:
        raise bad("seed", f"must fit in 64 bits, got {params.seed!r}")


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


def validate_structured_outputs(spec: StructuredOutputsParams) -> None:
    """A constraint within the default size, nesting and enum bounds (``engine/grammar/bounds.py``),
    checked before anything compiles it (a session event's, before the step that applies it)."""
    check_bounds(spec, GrammarBounds())

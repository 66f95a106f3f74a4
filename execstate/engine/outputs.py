"""Result types returned by the engine (field names follow vLLM's)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Logprob:
    logprob: float
    rank: int
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    """One completion.

    ``routed_experts``: ``int16[num_tokens - 1 - start, n_moe_layers, top_k]`` where
    num_tokens = prompt + generated and row i is the routing of the forward pass over
    token ``start + i`` (docs/ARCHITECTURE.md 4); ``None`` when route return is off or the model
    is dense.
    """

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    routed_experts: np.ndarray | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    # Where each prompt token's KV came from: {"local_cache": n, "offloaded": n, "transferred": n,
    # "computed": n} (this engine's prefix cache, its offload tiers, another instance, computed).
    prompt_token_sources: dict[str, int] = field(default_factory=dict)
    # PD handoff parameters (vLLM's name): set on a prefill instance's output for the decode side.
    kv_transfer_params: dict[str, Any] | None = None
    # Why the request was aborted (request-level error), None otherwise.
    error: str | None = None


@dataclass(frozen=True)
class ScoreOutput:
    """Teacher-forced scoring of a token sequence.

    ``logprobs[i]`` is log p(token_ids[i + 1] | token_ids[: i + 1]) (length n - 1).
    ``routed_experts`` has the rows the forward passes used (forced or free), shape
    ``[n - 1, n_moe_layers, top_k]``.
    """

    token_ids: list[int]
    logprobs: list[float]
    routed_experts: np.ndarray | None

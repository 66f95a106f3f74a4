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


@dataclass(frozen=True)
class PromptLogprobs:
    """The prompt's scores: row ``i`` is about token ``i + 1`` (the first token has none).
    ``logprobs[i]``: its logprob; ``ranks[i]``: its rank; ``top_ids[i]`` / ``top_logprobs[i]``:
    the ``k`` most likely tokens at that position, most likely first."""

    token_ids: list[int]
    logprobs: np.ndarray  # float32[n - 1]
    ranks: np.ndarray  # int64[n - 1]
    top_ids: np.ndarray  # int64[n - 1, k]
    top_logprobs: np.ndarray  # float32[n - 1, k]

    def __len__(self) -> int:
        return len(self.token_ids)

    def entries(self) -> list[dict[int, Logprob] | None]:
        """vLLM's ``prompt_logprobs``: ``None``, then per token ``{token: Logprob, alternative: Logprob...}``
        (``decoded_token`` unset: the caller decodes what it shows)."""
        out: list[dict[int, Logprob] | None] = [None] if self.token_ids else []
        own, ranks = self.logprobs.tolist(), self.ranks.tolist()
        ids, vals = self.top_ids.tolist(), self.top_logprobs.tolist()
        for i, tok in enumerate(self.token_ids[1:]):
            entry = {tok: Logprob(own[i], ranks[i])}
            for r, (t, v) in enumerate(zip(ids[i], vals[i], strict=True)):
                entry.setdefault(t, Logprob(v, r + 1))
            out.append(entry)
        return out


@dataclass
class CompletionOutput:
    """One completion.

    ``routed_experts``: ``int16[num_tokens - 1 - start, n_moe_layers, top_k]`` where
    num_tokens = prompt + generated and row i is the routing of the forward pass over
    token ``start + i`` (docs/contracts.md 4); ``None`` when route return is off or the model
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
    # vLLM's prompt_logprobs, when the request asked for them (engine/prompt_logprobs.py): in every
    # output once the prompt is scored (a DELTA request: in its first output only).
    prompt_logprobs: PromptLogprobs | None = None


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

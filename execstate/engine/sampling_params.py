"""Sampling parameters (vLLM-compatible names) and their validation.

Every invalid value raises ``ValueError`` naming the parameter; nothing here touches
engine state, so a bad request is rejected before it can affect anything.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class RequestOutputKind(enum.Enum):
    """What each ``RequestOutput`` of a request carries (vLLM's names).

    - ``CUMULATIVE``: everything so far (text, token ids, logprobs) in every output.
    - ``DELTA``: only what is new since the previous output; the final one carries
      ``finish_reason``, ``stop_reason``, routes and the rest of the held-back text.
    - ``FINAL_ONLY``: a single output when the request finishes, with everything.
    """

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclass
class SamplingParams:
    """How to sample one completion.

    - ``temperature == 0`` is greedy; ``top_k`` (``None`` or ``-1``/``0`` = off),
      ``top_p`` in (0, 1]; ``seed`` makes a request's sampling reproducible on its own.
    - ``max_tokens`` new tokens at most (``None`` = up to the model's context);
      generation also stops at EOS (unless ``ignore_eos``), any ``stop_token_ids`` or
      ``stop`` string.
    - ``logprobs``: ``None`` = no logprobs; ``k >= 0`` = the sampled token's logprob
      plus the ``k`` most likely alternatives at each step (raw model distribution).
    - R3: ``routed_experts_prompt_start`` omits the route rows before that token index.
      ``routed_experts``: routes to *force* (replay), ``int[N, n_moe_layers, top_k]``;
      row i forces the experts of the forward pass over token i (i < N); tokens beyond
      N route freely.
    - ``output_kind``: ``RequestOutputKind`` of the request's outputs (``LLM.generate``
      always uses ``FINAL_ONLY``).
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    routed_experts_prompt_start: int = 0
    routed_experts: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.top_k is not None and self.top_k <= 0:
            self.top_k = None
        self.validate()

    def validate(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"invalid sampling parameter {name}: {why}")

        if not isinstance(self.n, int) or self.n < 1:
            raise bad("n", f"must be an integer >= 1, got {self.n!r}")
        if not (self.temperature >= 0.0):
            raise bad("temperature", f"must be >= 0, got {self.temperature!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise bad("top_p", f"must be in (0, 1], got {self.top_p!r}")
        if self.top_k is not None and not isinstance(self.top_k, int):
            raise bad("top_k", f"must be an integer, got {self.top_k!r}")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            raise bad("max_tokens", f"must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise bad("min_tokens", f"must be an integer >= 0, got {self.min_tokens!r}")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or self.logprobs < 0):
            raise bad("logprobs", f"must be None or an integer >= 0, got {self.logprobs!r}")
        if self.stop_token_ids is not None and any(
            not isinstance(t, int) or t < 0 for t in self.stop_token_ids
        ):
            raise bad("stop_token_ids", "must be non-negative integers")
        if self.stop is not None and any(not isinstance(s, str) or not s for s in self.stop):
            raise bad("stop", "must be non-empty strings")
        if not isinstance(self.output_kind, RequestOutputKind):
            raise bad("output_kind", f"must be a RequestOutputKind, got {self.output_kind!r}")
        start = self.routed_experts_prompt_start
        if not isinstance(start, int) or start < 0:
            raise bad("routed_experts_prompt_start", f"must be an integer >= 0, got {start!r}")
        if self.routed_experts is not None:
            arr = np.asarray(self.routed_experts)
            if arr.ndim != 3 or not np.issubdtype(arr.dtype, np.integer):
                raise bad(
                    "routed_experts",
                    f"must be an integer array [tokens, n_moe_layers, top_k], got shape {arr.shape} "
                    f"dtype {arr.dtype}",
                )
            self.routed_experts = arr

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

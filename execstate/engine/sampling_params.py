"""Sampling parameters (vLLM-compatible names) and their validation.

Every invalid value raises ``ValueError`` naming the parameter; nothing here touches
engine state, so a bad request is rejected before it can affect anything.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from execstate.engine.grammar.spec import StructuredOutputsParams

GREEDY_TEMPERATURE = 1e-5  # below this a request samples greedily (vLLM's _SAMPLING_EPS)
LOGIT_BIAS_MAX = 100.0  # OpenAI: each bias in [-100, 100]


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

    - ``temperature`` below ``GREEDY_TEMPERATURE`` (1e-5, as vLLM) is greedy (argmax);
      ``top_k`` (``None`` or ``-1``/``0`` = off, else >= 1), ``top_p`` in (0, 1], ``min_p``
      in [0, 1] (drop tokens below ``min_p`` times the most likely token's probability);
      ``seed`` makes a request's sampling reproducible on its own, whatever its batch mates.
    - Penalties (vLLM/OpenAI semantics, see ``engine/penalties.py``): ``logit_bias``
      ({token id: bias in [-100, 100]}, added to the logits first); ``repetition_penalty``
      (> 0, over prompt and output tokens: positive logits divided, negative multiplied);
      ``presence_penalty`` / ``frequency_penalty`` (in [-2, 2], over output tokens:
      ``logits -= presence * (count > 0) + frequency * count``). They apply to greedy rows too.
    - ``max_tokens`` new tokens at most (``None`` = up to the model's context);
      generation also stops at EOS (unless ``ignore_eos``), any ``stop_token_ids`` or
      ``stop`` string.
    - ``logprobs``: ``None`` = no logprobs; ``k >= 0`` = the sampled token's logprob
      plus the ``k`` most likely alternatives at each step (raw model distribution).
    - ``prompt_logprobs``: ``None``, or ``k >= 0``: each prompt token's logprob and rank and the ``k``
      most likely tokens at its position, scored chunk by chunk as the prompt is prefilled
      (``engine/prompt_logprobs.py``; ``RequestOutput.prompt_logprobs``). Such a request takes no
      prefix-cache hit, and at most ``EngineConfig.prompt_logprobs_chunk_tokens`` of its tokens run
      per step.
    - R3: ``routed_experts_prompt_start`` omits the route rows before that token index.
      ``routed_experts``: routes to *force* (replay), ``int[N, n_moe_layers, top_k]``;
      row i forces the experts of the forward pass over token i (i < N); tokens beyond
      N route freely.
    - ``output_kind``: ``RequestOutputKind`` of the request's outputs (``LLM.generate``
      always uses ``FINAL_ONLY``).
    - ``return_hidden``: the final hidden state (the final norm applied) at the position that
      samples the first generated token (the prompt's last token) is returned with the request,
      ``float32[hidden_size]`` (a session step's ``FinishedStep.hidden``); a probe on the model's
      state there (``agent/end_probe.py``) reads it.
    - ``structured_outputs``: constrain the output to a JSON Schema, regex, choice or grammar
      (``engine/grammar/``; a ``{"regex": ...}``-style dict is converted); the request stops
      (``"stop"``) once the grammar is complete.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    routed_experts_prompt_start: int = 0
    routed_experts: Any = None
    structured_outputs: StructuredOutputsParams | None = None
    return_hidden: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.validate()
        if self.top_k is not None:
            self.top_k = int(self.top_k) if self.top_k > 0 else None  # -1 and 0 mean "off", as in vLLM
        if not self.logit_bias:
            self.logit_bias = None

    def validate(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"invalid sampling parameter {name}: {why}")

        if not isinstance(self.n, int) or self.n < 1:
            raise bad("n", f"must be an integer >= 1, got {self.n!r}")
        t = _finite(self.temperature)
        if t is None or t < 0.0:
            raise bad("temperature", f"must be a finite number >= 0, got {self.temperature!r}")
        top_p = _finite(self.top_p)
        if top_p is None or not (0.0 < top_p <= 1.0):
            raise bad("top_p", f"must be in (0, 1], got {self.top_p!r}")
        if self.top_k is not None and (not _int(self.top_k) or self.top_k < -1):
            raise bad("top_k", f"must be None, -1 or 0 (off) or an integer >= 1, got {self.top_k!r}")
        min_p = _finite(self.min_p)
        if min_p is None or not (0.0 <= min_p <= 1.0):
            raise bad("min_p", f"must be in [0, 1], got {self.min_p!r}")
        rep = _finite(self.repetition_penalty)
        if rep is None or rep <= 0.0:
            raise bad("repetition_penalty", f"must be a finite number > 0, got {self.repetition_penalty!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = _finite(getattr(self, name))
            if v is None or not (-2.0 <= v <= 2.0):
                raise bad(name, f"must be in [-2, 2], got {getattr(self, name)!r}")
            setattr(self, name, v)
        self.temperature, self.top_p, self.min_p, self.repetition_penalty = t, top_p, min_p, rep
        if self.logit_bias is not None:
            self.logit_bias = _logit_bias(self.logit_bias, bad)
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            raise bad("max_tokens", f"must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.return_hidden, bool):
            raise bad("return_hidden", f"must be a bool, got {self.return_hidden!r}")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise bad("min_tokens", f"must be an integer >= 0, got {self.min_tokens!r}")
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise bad(name, f"must be None or an integer >= 0, got {v!r}")
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
        if isinstance(self.structured_outputs, dict):  # as a JSON body carries it: {"regex": "..."}
            try:
                self.structured_outputs = StructuredOutputsParams.from_dict(self.structured_outputs)
            except (ValueError, TypeError) as exc:
                raise bad("structured_outputs", str(exc)) from None
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise bad("structured_outputs", "must be a StructuredOutputsParams or a {kind: value} dict")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def uses_penalties(self) -> bool:
        """Whether sampling needs this request's token history or a logit bias."""
        return (
            self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
            or bool(self.logit_bias)
        )


def _int(v: Any) -> bool:
    return isinstance(v, int | np.integer) and not isinstance(v, bool)


def _finite(v: Any) -> float | None:
    """``v`` as a finite float, or ``None`` when it is not a finite real number."""
    if not isinstance(v, int | float | np.integer | np.floating) or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def _logit_bias(bias: Any, bad: Any) -> dict[int, float]:
    """``{token id: bias}`` with int ids >= 0 and finite biases in [-100, 100] (OpenAI's range).
    Whether the ids are inside the vocabulary is checked by the engine, which knows it."""
    if not isinstance(bias, dict):
        raise bad("logit_bias", f"must be a dict of token id -> bias, got {type(bias).__name__}")
    out: dict[int, float] = {}
    for tok, b in bias.items():
        if not _int(tok) or tok < 0:
            raise bad("logit_bias", f"keys must be token ids (integers >= 0), got {tok!r}")
        f = _finite(b)
        if f is None or not (-LOGIT_BIAS_MAX <= f <= LOGIT_BIAS_MAX):
            raise bad("logit_bias", f"bias of token {tok} must be in [-100, 100], got {b!r}")
        out[int(tok)] = f
    return out

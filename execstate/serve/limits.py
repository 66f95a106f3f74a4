"""The bounds a server puts on one request (docs/contracts.md 8: everything is bounded).

``ServingLimits`` holds them, with the defaults ``execstate serve`` uses; each is a
``serve`` option of the same name (``max_n`` -> ``--max-n``) and ``build_app`` takes
one. Where each is enforced, before the request can cost the engine anything:

- ``max_request_bytes``: ``BodySizeLimitMiddleware``, 413 before the body is parsed.
- ``max_n``, ``max_logprobs``, ``max_prompts_per_request``, ``max_stop_strings``,
  ``max_stop_string_length``, ``max_stop_token_ids``: ``openai/limit_checks.check_limits``,
  400 naming the parameter and the option, before tokenisation.
- ``max_waiting_requests``: the ``AsyncEngine``'s admission control (``serve`` builds it
  with this value), 429 with ``Retry-After`` when the waiting queue is full; 400 for one
  request that needs more engine requests (prompts x n) than the queue holds.
- ``max_tokens`` is bounded by the model's context (``convert.validate_prompts``).
- ``max_logprobs_prompt_tokens``: ``openai/prompt_scores.check_scored_lengths``, 400 once the
  prompts are tokenised, before any is scored (scoring runs chunk by chunk through the scheduler,
  ``engine/prompt_logprobs.py``; this bounds a request's total work and its answer's size).

Imports only the standard library (the CLI reads the defaults for ``--help``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

MiB = 1024 * 1024


@dataclass(frozen=True)
class ServingLimits:
    max_n: int = 128  # choices per prompt (n)
    max_logprobs: int = 20  # logprobs (completions) / top_logprobs (chat)
    max_prompts_per_request: int = 256  # prompts in one /v1/completions body
    max_stop_strings: int = 16  # entries of stop
    max_stop_string_length: int = 256  # characters of one stop string
    max_stop_token_ids: int = 256  # entries of stop_token_ids
    max_request_bytes: int = 4 * MiB  # HTTP request body
    max_waiting_requests: int = 256  # engine requests admitted and not yet scheduled
    max_logprobs_prompt_tokens: int = 8192  # longest prompt scored (echo with logprobs, prompt_logprobs)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            low = 0 if f.name == "max_logprobs" else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{f.name} must be an integer >= {low}, got {value!r}")


def option_name(field_name: str) -> str:
    """The ``serve`` option that sets a limit: ``max_n`` -> ``--max-n``."""
    return "--" + field_name.replace("_", "-")


def parse_size(text: str) -> int:
    """A byte count: ``4194304``, ``4MiB``, ``2 GiB``, ``1.5GB`` (pydantic's ``ByteSize``)."""
    from pydantic import ByteSize, TypeAdapter, ValidationError

    try:
        return int(TypeAdapter(ByteSize).validate_python(text))
    except ValidationError:
        raise ValueError(f"not a size: {text!r} (bytes, or a number with a unit such as 512MiB or 2GiB)") from None

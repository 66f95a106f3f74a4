"""``check_limits``: a parsed request body against the server's ``ServingLimits``.

Runs on the event loop before any tokenisation or engine work, so every check is
O(1) or bounded by an earlier one (the number of stop strings is checked before
their lengths). Raises a 400 ``OpenAIError`` naming the parameter and the ``serve``
option that sets its bound.
"""

from __future__ import annotations

from execstate.serve.errors import bad_request
from execstate.serve.limits import ServingLimits, option_name
from execstate.serve.openai.protocol import ChatCompletionRequest, CompletionRequest, SamplingRequest


def _over(param: str, value: int, limit: str, bound: int, what: str = "") -> None:
    if value > bound:
        raise bad_request(f"{param}{what} must be <= {bound} ({option_name(limit)}), got {value}", param=param)


def num_prompts(req: CompletionRequest) -> int:
    """How many prompts ``prompt`` holds (one text, one id list, or a list of either)."""
    p = req.prompt
    if isinstance(p, str) or not p or isinstance(p[0], int):  # parsed: a list starting with an id is one prompt
        return 1
    return len(p)


def check_limits(req: SamplingRequest, limits: ServingLimits) -> None:
    """400 for the first field of ``req`` beyond its bound."""
    _over("n", req.n, "max_n", limits.max_n)
    if isinstance(req, CompletionRequest):
        _over("prompt", num_prompts(req), "max_prompts_per_request", limits.max_prompts_per_request,
              " (the number of prompts)")
        if req.logprobs is not None:
            _over("logprobs", req.logprobs, "max_logprobs", limits.max_logprobs)
    if isinstance(req, ChatCompletionRequest) and req.top_logprobs is not None:
        _over("top_logprobs", req.top_logprobs, "max_logprobs", limits.max_logprobs)
    stop = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
    _over("stop", len(stop), "max_stop_strings", limits.max_stop_strings, " (the number of strings)")
    longest = max((len(s) for s in stop), default=0)
    _over("stop", longest, "max_stop_string_length", limits.max_stop_string_length, " (characters per string)")
    _over("stop_token_ids", len(req.stop_token_ids or []), "max_stop_token_ids", limits.max_stop_token_ids,
          " (the number of ids)")

"""The part of a generation request that chat and completions share: admitted engine requests
from prompts, a stream or the finished outputs, and the request's admission released once.

Contract (``run_generation``): the caller has checked the request and reserved ``admission``
(``ServeContext.admit``). The prompts are built in a worker thread (``make_prompts``), expanded
to one engine request per choice, and then either

- streamed: ``make_stream(subs, request_id, admission)`` builds the SSE body; the response
  releases the admission when the stream is over, and is returned as the ``Response``;
- or awaited: every choice's final output, returned as :class:`Finished`. A client that
  disconnects aborts them all; the result is then a 499 ``Response``.

With ``prompt_logprobs`` (a number of alternatives), each prompt is scored first
(``serve/openai/prompt_scores.py``: ``PromptInput.scores``). With ``generate`` False
(``max_tokens: 0``: echo or prompt logprobs only) no engine request is made: a stream gets the
choices with nothing to run, a non-streamed request returns them with no final outputs.

A ``ValueError`` on the way (a prompt too long, a bad token id) is a 400, a dead engine a
503; in every case but a started stream the admission is released here, exactly once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from execstate.engine.async_engine import Admission, EngineDeadError
from execstate.engine.outputs import RequestOutput
from execstate.engine.sampling_params import RequestOutputKind, SamplingParams
from execstate.serve.context import ServeContext, engine_dead, new_request_id
from execstate.serve.errors import bad_request
from execstate.serve.openai.generation import (
    PromptInput,
    SubRequest,
    cancel_on_disconnect,
    expand,
    final_outputs,
)
from execstate.serve.openai.prompt_scores import score_prompts
from execstate.serve.openai.streaming import SSEResponse
from execstate.transfer.handoff import Handoff

StreamMaker = Callable[[list[SubRequest], str, Admission], AsyncIterator[str]]


@dataclass(frozen=True)
class Finished:
    """A non-streamed request's outcome: its id, engine requests and their final outputs."""

    request_id: str
    prompts: list[PromptInput]
    subs: list[SubRequest]
    finals: list[RequestOutput]


async def run_generation(
    ctx: ServeContext, raw: Request, admission: Admission, make_prompts: Callable[[], list[PromptInput]],
    id_prefix: str, params: SamplingParams, kv: dict[str, Any] | Handoff | None, cache_salt: str | None,
    stream: bool, make_stream: StreamMaker, arrival: float, prompt_logprobs: int | None = None,
    generate: bool = True,
) -> Response | Finished:
    eng = ctx.engine
    pending: Admission | None = admission
    try:
        prompts = await ctx.in_worker(make_prompts)
        if prompt_logprobs is not None:
            prompts = await score_prompts(ctx, prompts, prompt_logprobs)
        request_id = new_request_id(id_prefix)
        kind = RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY
        subs = expand(request_id, prompts, params, params.n, kv, ctx.scope_of(raw, cache_salt), output_kind=kind)
        if not generate and not stream:
            return Finished(request_id, prompts, subs, [])
        if stream:
            response = SSEResponse(make_stream(subs, request_id, admission), on_close=partial(eng.release, admission))
            pending = None  # released by the response, once the stream is over
            return response
        finals = await cancel_on_disconnect(raw, final_outputs(eng, subs, ctx.metrics, arrival, admission))
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    except EngineDeadError as exc:
        raise engine_dead(exc) from None
    finally:
        if pending is not None:
            eng.release(pending)
    if finals is None:  # the client is gone; its requests were aborted
        return Response(status_code=499)
    return Finished(request_id, prompts, subs, finals)

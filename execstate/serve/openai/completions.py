"""``POST /v1/completions``: text or token-id prompts (one or a list), n choices each.

Choice ``index = prompt_index * n + j``. Non-streaming: one response once every choice
has finished (a client disconnect aborts them all). Streaming: SSE chunks forwarding the
engine's deltas (see ``streaming``), the finishing chunk of a choice carries its
``finish_reason`` (and ``routed_experts``), an optional usage chunk
(``stream_options.include_usage``), then ``data: [DONE]``. An error after the stream
started is sent as one ``data: {"error": ...}`` event before ``[DONE]``.

Order of checks: the server's bounds and the sampling parameters first (cheap, on the
event loop), then the request's engine requests are admitted to the waiting queue
(429 when full), then the prompts are tokenised and validated in a worker thread.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from functools import partial

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from execstate.engine.async_engine import Admission, AsyncEngine
from execstate.engine.outputs import RequestOutput
from execstate.serve.context import ServeContext, as_openai_error
from execstate.serve.errors import bad_request
from execstate.serve.openai.convert import (
    check_logit_bias,
    check_unsupported,
    completion_logprobs,
    completion_prompts,
    sampling_params,
    validate_prompts,
)
from execstate.serve.openai.generation import (
    PromptInput,
    SubRequest,
    merged_outputs,
    usage_of,
)
from execstate.serve.openai.limit_checks import check_limits, num_prompts
from execstate.serve.openai.pipeline import run_generation
from execstate.serve.openai.protocol import (
    CompletionChoice,
    CompletionChunk,
    CompletionRequest,
    CompletionResponse,
)
from execstate.serve.openai.streaming import sse
from execstate.serve.route_rows import encode_routes


async def create_completion(ctx: ServeContext, req: CompletionRequest, raw: Request) -> Response:
    arrival = time.monotonic()
    ctx.check_request(req.model)
    check_unsupported(req)
    check_limits(req, ctx.limits)
    eng = ctx.engine
    params = sampling_params(req, req.max_tokens, req.logprobs)
    ctx.check_sampling(params)
    if req.kv_transfer_params is not None and num_prompts(req) != 1:
        raise bad_request("kv_transfer_params needs exactly one prompt", param="kv_transfer_params")
    check_logit_bias(params, eng.model_config.vocab_size)
    kv = ctx.accept_kv_transfer_params(req.kv_transfer_params)  # 400 before the engine, trusted or not at all
    admission = ctx.admit(num_prompts(req) * params.n)
    done = await run_generation(
        ctx, raw, admission, partial(_prompts, req, eng, params.max_tokens), "cmpl", params, kv, req.cache_salt,
        req.stream, partial(_stream, ctx, req, arrival=arrival), arrival)
    if isinstance(done, Response):
        return done
    subs, finals, request_id = done.subs, done.finals, done.request_id
    choices = [
        _choice(ctx, req, out, s.index, 0, with_prompt=True)
        for s, out in zip(subs, finals, strict=True)
    ]
    body = CompletionResponse(
        id=request_id, model=ctx.served_model_name, choices=choices,
        usage=usage_of(subs, {s.index: o for s, o in zip(subs, finals, strict=True)}),
        kv_transfer_params=finals[0].kv_transfer_params if len(finals) == 1 else None,
    )
    return JSONResponse(body.model_dump())


def _prompts(req: CompletionRequest, eng: AsyncEngine, max_tokens: int | None) -> list[PromptInput]:
    """Tokenised and validated prompts (runs in a worker thread)."""
    prompts = completion_prompts(req, eng.tokenizer, eng.max_model_len)
    validate_prompts(prompts, eng.model_config.vocab_size, eng.max_model_len, max_tokens)
    return prompts


def _choice(
    ctx: ServeContext, req: CompletionRequest, out: RequestOutput, index: int, text_offset: int,
    with_prompt: bool,
) -> CompletionChoice:
    """A choice (or a stream chunk's choice) with what ``out`` carries (all, or a delta)."""
    c = out.outputs[0]
    ids = c.token_ids
    logprobs = None
    if c.logprobs is not None:
        logprobs = completion_logprobs(ids, c.logprobs, text_offset)
    done = out.finished
    return CompletionChoice(
        index=index,
        text=c.text,
        logprobs=logprobs,
        finish_reason=c.finish_reason if done else None,
        stop_reason=c.stop_reason if done else None,
        routed_experts=encode_routes(c.routed_experts) if done and ctx.engine.return_routes else None,
        token_ids=ids if req.return_token_ids else None,
        prompt_token_ids=out.prompt_token_ids if req.return_token_ids and with_prompt else None,
    )


async def _stream(
    ctx: ServeContext, req: CompletionRequest, subs: list[SubRequest], request_id: str, admission: Admission,
    *, arrival: float,
) -> AsyncIterator[str]:
    offsets = {s.index: 0 for s in subs}  # logprobs text_offset of each choice's next token
    num_tokens = dict.fromkeys(offsets, 0)
    started: set[int] = set()  # choices that sent a chunk
    finals: dict[int, RequestOutput] = {}
    model = ctx.served_model_name
    wants_tokens = req.return_token_ids or req.logprobs is not None
    try:
        async with aclosing(merged_outputs(ctx.engine, subs, ctx.metrics, arrival, admission)) as stream:
            async for sub, out in stream:
                c = out.outputs[0]  # a delta: only what is new since the previous output
                num_tokens[sub.index] += len(c.token_ids)
                if not (c.text or out.finished or (c.token_ids and wants_tokens)):
                    continue  # nothing to show (these tokens are not asked for)
                choice = _choice(ctx, req, out, sub.index, offsets[sub.index], with_prompt=sub.index not in started)
                started.add(sub.index)
                if choice.logprobs is not None:
                    offsets[sub.index] += sum(len(t) for t in choice.logprobs.tokens)
                kv = out.kv_transfer_params if out.finished and len(subs) == 1 else None
                chunk = CompletionChunk(id=request_id, model=model, choices=[choice], kv_transfer_params=kv)
                yield sse(chunk.model_dump())
                if out.finished:
                    finals[sub.index] = out
        if req.stream_options is not None and req.stream_options.include_usage:
            usage = usage_of(subs, finals, num_tokens)
            yield sse(CompletionChunk(id=request_id, model=model, choices=[], usage=usage).model_dump())
    except Exception as exc:  # the stream has started: report in-band
        yield sse(as_openai_error(exc).body())
    yield sse("[DONE]")


"""``POST /v1/completions``: text or token-id prompts (one or a list), n choices each.

Choice ``index = prompt_index * n + j``. Non-streaming: one response once every choice
has finished (a client disconnect aborts them all). Streaming: SSE chunks forwarding the
engine's deltas (see ``streaming``), the finishing chunk of a choice carries its
``finish_reason`` (and ``routed_experts``), an optional usage chunk
(``stream_options.include_usage``), then ``data: [DONE]``. An error after the stream
started is sent as one ``data: {"error": ...}`` event before ``[DONE]``.

Order of checks: the server's bounds and the sampling parameters first (cheap, on the
event loop), then a structured-output constraint is compiled (``response_format`` /
``structured_outputs``, in a grammar worker with a timeout: ``structured.py``), then the
request's engine requests are admitted to the waiting queue (429 when full), then the prompts
are tokenised and validated in a worker thread.

``echo``: each choice's text starts with its prompt (the first chunk of a stream carries it),
and with ``logprobs`` so do its logprobs (the prompt's first token: ``null``), scored by
``LLM.score``'s forward pass (``prompt_scores.py``). ``max_tokens: 0`` generates nothing (with
``echo`` or ``prompt_logprobs`` only: how lm-evaluation-harness scores log-likelihoods);
``prompt_logprobs`` (vLLM) adds each choice's ``prompt_logprobs``.
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
from execstate.serve.openai.pipeline import Finished, run_generation
from execstate.serve.openai.prompt_scores import echo_logprobs, vllm_prompt_logprobs
from execstate.serve.openai.protocol import (
    CompletionChoice,
    CompletionChunk,
    CompletionRequest,
    CompletionResponse,
    PromptTokensDetails,
    Usage,
)
from execstate.serve.openai.streaming import sse
from execstate.serve.openai.structured import compile_constraint, constraint_of
from execstate.serve.route_rows import encode_routes


async def create_completion(ctx: ServeContext, req: CompletionRequest, raw: Request) -> Response:
    arrival = time.monotonic()
    ctx.check_request(req.model)
    check_unsupported(req)
    check_limits(req, ctx.limits)
    ctx.wants_routes(req.return_routed_experts)  # 400 before any work when none can be returned
    eng = ctx.engine
    generate = req.max_tokens != 0
    if not generate and not (req.echo or req.prompt_logprobs is not None):
        raise bad_request("max_tokens 0 generates nothing: it needs echo or prompt_logprobs", param="max_tokens")
    spec = constraint_of(req)
    params = sampling_params(req, req.max_tokens if generate else 1, req.logprobs, spec)
    ctx.check_sampling(params)
    if req.kv_transfer_params is not None and num_prompts(req) != 1:
        raise bad_request("kv_transfer_params needs exactly one prompt", param="kv_transfer_params")
    check_logit_bias(params, eng.model_config.vocab_size)
    kv = ctx.accept_kv_transfer_params(req.kv_transfer_params)  # 400 before the engine, trusted or not at all
    if spec is not None:
        await compile_constraint(ctx, spec, "response_format" if req.response_format else "structured_outputs")
    admission = ctx.admit(num_prompts(req) * params.n)
    done = await run_generation(
        ctx, raw, admission, partial(_prompts, req, eng, params.max_tokens if generate else 0), "cmpl", params, kv,
        req.cache_salt, req.stream, partial(_stream, ctx, req, arrival=arrival), arrival,
        prompt_logprobs=_prompt_k(req), generate=generate)
    if isinstance(done, Response):
        return done
    if _prompt_k(req) is not None:  # a scored prompt: its logprobs make a large body, built off the event loop
        return await ctx.in_worker(_response, ctx, req, done, generate)
    return _response(ctx, req, done, generate)


def _response(ctx: ServeContext, req: CompletionRequest, done: Finished, generate: bool) -> JSONResponse:
    subs, finals, request_id = done.subs, done.finals, done.request_id
    if not generate:
        choices = [_echo_choice(req, s) for s in subs]
        return JSONResponse(CompletionResponse(id=request_id, model=ctx.served_model_name, choices=choices,
                                               usage=_prompt_usage(subs)).model_dump())
    choices = [
        _choice(ctx, req, out, s, 0, with_prompt=True)
        for s, out in zip(subs, finals, strict=True)
    ]
    body = CompletionResponse(
        id=request_id, model=ctx.served_model_name, choices=choices,
        usage=usage_of(subs, {s.index: o for s, o in zip(subs, finals, strict=True)}),
        kv_transfer_params=finals[0].kv_transfer_params if len(finals) == 1 else None,
    )
    return JSONResponse(body.model_dump())


def _prompt_k(req: CompletionRequest) -> int | None:
    """How many alternatives per prompt token to score (None: the prompt is not scored)."""
    wanted = [k for k in (req.prompt_logprobs, req.logprobs if req.echo else None) if k is not None]
    return max(wanted) if wanted else None


def _prompt_text(prompt: PromptInput) -> str:
    return prompt.text or ""


def _echo_choice(req: CompletionRequest, sub: SubRequest) -> CompletionChoice:
    """A choice of a ``max_tokens: 0`` request: the prompt only."""
    p = sub.prompt
    logprobs = echo_logprobs(p.token_ids, p.scores, req.logprobs) if req.logprobs is not None and p.scores else None
    return CompletionChoice(
        index=sub.index, text=_prompt_text(p) if req.echo else "", logprobs=logprobs if req.echo else None,
        finish_reason="length", prompt_token_ids=p.token_ids if req.return_token_ids else None,
        token_ids=[] if req.return_token_ids else None,
        prompt_logprobs=vllm_prompt_logprobs(p.scores) if req.prompt_logprobs is not None and p.scores else None)


def _prompt_usage(subs: list[SubRequest]) -> Usage:
    """Usage of a request that generated nothing: each prompt once."""
    n = sum(len(p.token_ids) for p in {s.prompt_index: s.prompt for s in subs}.values())
    return Usage(prompt_tokens=n, completion_tokens=0, total_tokens=n,
                 prompt_tokens_details=PromptTokensDetails(cached_tokens=0), prompt_token_sources={})


def _prompts(req: CompletionRequest, eng: AsyncEngine, max_tokens: int | None) -> list[PromptInput]:
    """Tokenised and validated prompts (runs in a worker thread); an echoed token-id prompt gets its
    text."""
    prompts = completion_prompts(req, eng.tokenizer, eng.max_model_len)
    validate_prompts(prompts, eng.model_config.vocab_size, eng.max_model_len, max_tokens)
    if req.echo and eng.tokenizer is not None:
        tok = eng.tokenizer
        prompts = [p if p.text is not None else PromptInput(p.token_ids, tok.decode(p.token_ids, False))
                   for p in prompts]
    return prompts


def _choice(
    ctx: ServeContext, req: CompletionRequest, out: RequestOutput, sub: SubRequest, text_offset: int,
    with_prompt: bool,
) -> CompletionChoice:
    """A choice (or a stream chunk's choice) with what ``out`` carries (all, or a delta); with
    ``with_prompt`` (the whole choice, or a stream's first chunk) the echoed prompt first."""
    c = out.outputs[0]
    ids = c.token_ids
    routes = ctx.wants_routes(req.return_routed_experts)
    echo = req.echo and with_prompt
    prompt = sub.prompt
    text = _prompt_text(prompt) + c.text if echo else c.text
    logprobs = None
    if echo and req.logprobs is not None and prompt.scores is not None:
        logprobs = echo_logprobs(prompt.token_ids, prompt.scores, req.logprobs)
        text_offset += sum(len(t) for t in logprobs.tokens)
    if c.logprobs is not None:
        gen = completion_logprobs(ids, c.logprobs, text_offset)
        if logprobs is None:
            logprobs = gen
        else:
            for f in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                getattr(logprobs, f).extend(getattr(gen, f))
    done = out.finished
    plp = req.prompt_logprobs is not None and with_prompt and prompt.scores is not None
    return CompletionChoice(
        index=sub.index,
        text=text,
        logprobs=logprobs,
        finish_reason=c.finish_reason if done else None,
        stop_reason=c.stop_reason if done else None,
        routed_experts=encode_routes(c.routed_experts) if done and routes else None,
        token_ids=ids if req.return_token_ids else None,
        prompt_token_ids=out.prompt_token_ids if req.return_token_ids and with_prompt else None,
        prompt_logprobs=vllm_prompt_logprobs(prompt.scores) if plp and prompt.scores else None,
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
        if req.max_tokens == 0:  # nothing to generate: the prompts only
            for s in subs:
                yield sse(CompletionChunk(id=request_id, model=model, choices=[_echo_choice(req, s)]).model_dump())
            subs = []
        async with aclosing(merged_outputs(ctx.engine, subs, ctx.metrics, arrival, admission)) as stream:
            async for sub, out in stream:
                c = out.outputs[0]  # a delta: only what is new since the previous output
                num_tokens[sub.index] += len(c.token_ids)
                first = sub.index not in started
                if not (c.text or out.finished or (c.token_ids and wants_tokens) or (first and req.echo)):
                    continue  # nothing to show (these tokens are not asked for)
                choice = _choice(ctx, req, out, sub, offsets[sub.index], with_prompt=first)
                started.add(sub.index)
                if choice.logprobs is not None:
                    offsets[sub.index] = choice.logprobs.text_offset[-1] + len(choice.logprobs.tokens[-1]) \
                        if choice.logprobs.tokens else offsets[sub.index]
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


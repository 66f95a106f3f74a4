"""``POST /v1/chat/completions``: the chat template renders ``messages`` into one prompt.

``max_completion_tokens`` (or the older ``max_tokens``) defaults to the room left in the
context. ``logprobs: true`` returns the sampled tokens' logprobs with ``top_logprobs``
alternatives (0 to ``--max-logprobs``). The template is rendered and the prompt tokenised
in a worker thread, after the request was admitted (see ``completions``). Streaming: a first chunk per choice with
``delta.role``, then content deltas; the finishing chunk of a choice carries ``finish_reason`` (and
``routed_experts``); an optional usage chunk; then ``data: [DONE]``.

Tools (``tools.py``): the tools reach the prompt; ``tool_choice`` ``required`` or a named function
is enforced by the parser's grammar, compiled with any ``response_format`` / ``structured_outputs``
constraint (``structured.py``: at most one per request) before admission. A choice's output is
split into ``message.content`` and ``message.tool_calls`` (streamed: ``delta.tool_calls``, each
call whole once complete); ``finish_reason`` is ``"tool_calls"`` when it called. vLLM's
``prompt_logprobs`` adds the prompt's logprobs (``prompt_scores.py``).
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
    chat_logprobs,
    chat_prompt,
    check_logit_bias,
    check_unsupported,
    sampling_params,
    validate_prompts,
)
from execstate.serve.openai.generation import (
    PromptInput,
    SubRequest,
    merged_outputs,
    usage_of,
)
from execstate.serve.openai.limit_checks import check_limits
from execstate.serve.openai.pipeline import run_generation
from execstate.serve.openai.prompt_scores import vllm_prompt_logprobs
from execstate.serve.openai.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatStreamChoice,
    DeltaMessage,
)
from execstate.serve.openai.streaming import sse
from execstate.serve.openai.structured import compile_constraint, constraint_of
from execstate.serve.openai.tools import ToolOutput, ToolRequest, tool_request
from execstate.serve.route_rows import encode_routes


async def create_chat_completion(ctx: ServeContext, req: ChatCompletionRequest, raw: Request) -> Response:
    arrival = time.monotonic()
    ctx.check_request(req.model)
    check_unsupported(req)
    check_limits(req, ctx.limits)
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs needs logprobs: true", param="top_logprobs")
    if req.top_logprobs is not None and req.top_logprobs < 0:
        raise bad_request(f"top_logprobs must be >= 0, got {req.top_logprobs}", param="top_logprobs")
    routes = ctx.wants_routes(req.return_routed_experts)  # 400 before any work when none can be returned
    eng = ctx.engine
    tools = tool_request(req)
    spec = constraint_of(req, tools.constraint if tools is not None else None)
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    params = sampling_params(req, max_tokens, (req.top_logprobs or 0) if req.logprobs else None, spec)
    check_logit_bias(params, eng.model_config.vocab_size)
    ctx.check_sampling(params)
    kv = ctx.accept_kv_transfer_params(req.kv_transfer_params)  # 400 before the engine, trusted or not at all
    if spec is not None:
        param = "response_format" if req.response_format else "structured_outputs" if req.structured_outputs \
            else "tool_choice"
        await compile_constraint(ctx, spec, param)
    admission = ctx.admit(params.n)
    done = await run_generation(
        ctx, raw, admission, partial(_prompts, req, eng, params.max_tokens, tools), "chatcmpl", params, kv,
        req.cache_salt, req.stream, partial(_stream, ctx, req, tools, arrival=arrival), arrival,
        prompt_logprobs=req.prompt_logprobs)
    if isinstance(done, Response):
        return done
    subs, finals, prompt = done.subs, done.finals, done.prompts[0]
    request_id = done.request_id
    choices = []
    for s, out in zip(subs, finals, strict=True):
        c = out.outputs[0]
        message, finish = AssistantMessage(content=c.text), c.finish_reason
        if tools is not None and tools.parses:
            split = ToolOutput(tools)
            content, calls = split.whole(c.text)
            message, finish = AssistantMessage(content=content, tool_calls=calls), split.finish_reason(finish)
        choices.append(
            ChatChoice(
                index=s.index,
                message=message,
                logprobs=_logprobs(req, out),
                finish_reason=finish,
                stop_reason=c.stop_reason,
                routed_experts=encode_routes(c.routed_experts) if routes else None,
                token_ids=c.token_ids if req.return_token_ids else None,
            )
        )

    def respond() -> JSONResponse:
        body = ChatCompletionResponse(
            id=request_id, model=ctx.served_model_name, choices=choices,
            usage=usage_of(subs, {s.index: o for s, o in zip(subs, finals, strict=True)}),
            prompt_token_ids=prompt.token_ids if req.return_token_ids else None,
            kv_transfer_params=finals[0].kv_transfer_params if len(finals) == 1 else None,
            prompt_logprobs=vllm_prompt_logprobs(prompt.scores) if prompt.scores is not None else None,
        )
        return JSONResponse(body.model_dump())

    # a scored prompt's logprobs make a large body: built off the event loop
    return await ctx.in_worker(respond) if prompt.scores is not None else respond()


def _prompts(req: ChatCompletionRequest, eng: AsyncEngine, max_tokens: int | None,
             tools: ToolRequest | None) -> list[PromptInput]:
    """The templated, tokenised and validated prompt, alone in a list (runs in a worker thread)."""
    prompt = chat_prompt(req, eng.tokenizer, eng.max_model_len, tools)
    validate_prompts([prompt], eng.model_config.vocab_size, eng.max_model_len, max_tokens)
    return [prompt]


def _logprobs(req: ChatCompletionRequest, out: RequestOutput) -> ChatLogprobs | None:
    """Logprobs of the tokens ``out`` carries (all, or a stream's delta)."""
    c = out.outputs[0]
    if not req.logprobs or c.logprobs is None:
        return None
    return chat_logprobs(c.token_ids, c.logprobs, req.top_logprobs or 0)


async def _stream(
    ctx: ServeContext, req: ChatCompletionRequest, tools: ToolRequest | None, subs: list[SubRequest],
    request_id: str, admission: Admission, *, arrival: float,
) -> AsyncIterator[str]:
    model = ctx.served_model_name
    routes = ctx.wants_routes(req.return_routed_experts)
    num_tokens = {s.index: 0 for s in subs}
    finals: dict[int, RequestOutput] = {}
    prompt_ids = subs[0].prompt.token_ids if req.return_token_ids else None
    scores = subs[0].prompt.scores
    plp = vllm_prompt_logprobs(scores) if scores is not None else None
    splits = {s.index: ToolOutput(tools) for s in subs} if tools is not None and tools.parses else {}
    for s in subs:
        first = ChatStreamChoice(index=s.index, delta=DeltaMessage(role="assistant", content=""))
        yield sse(ChatCompletionChunk(id=request_id, model=model, choices=[first], prompt_token_ids=prompt_ids,
                                      prompt_logprobs=plp).model_dump())
        plp = None
    try:
        async with aclosing(merged_outputs(ctx.engine, subs, ctx.metrics, arrival, admission)) as stream:
            async for sub, out in stream:
                c = out.outputs[0]  # a delta: only what is new since the previous output
                num_tokens[sub.index] += len(c.token_ids)
                done = out.finished
                text, calls, finish = c.text, None, c.finish_reason
                split = splits.get(sub.index)
                if split is not None:
                    text, calls = split.feed(c.text)
                    text += split.end() if done else ""
                    finish = split.finish_reason(finish)
                if not (text or calls or done or (c.token_ids and (req.return_token_ids or req.logprobs))):
                    continue  # nothing to show (these tokens are not asked for)
                choice = ChatStreamChoice(
                    index=sub.index,
                    delta=DeltaMessage(content=text if text or not calls else None, tool_calls=calls or None),
                    logprobs=_logprobs(req, out),
                    finish_reason=finish if done else None,
                    stop_reason=c.stop_reason if done else None,
                    routed_experts=encode_routes(c.routed_experts) if done and routes else None,
                    token_ids=c.token_ids if req.return_token_ids else None,
                )
                kv = out.kv_transfer_params if done and len(subs) == 1 else None
                chunk = ChatCompletionChunk(id=request_id, model=model, choices=[choice], kv_transfer_params=kv)
                yield sse(chunk.model_dump())
                if done:
                    finals[sub.index] = out
        if req.stream_options is not None and req.stream_options.include_usage:
            usage = usage_of(subs, finals, num_tokens)
            yield sse(ChatCompletionChunk(id=request_id, model=model, choices=[], usage=usage).model_dump())
    except Exception as exc:  # the stream has started: report in-band
        yield sse(as_openai_error(exc).body())
    yield sse("[DONE]")

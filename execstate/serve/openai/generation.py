"""Running one HTTP request's engine requests: n choices per prompt, merged, metered.

An HTTP request with P prompts and ``n`` choices becomes P*n engine requests (choice
``index = p * n + j``, seed ``seed + j`` as in ``LLM.generate``), each with the
``output_kind`` its response needs: ``DELTA`` for a stream (every output carries only
what is new), ``FINAL_ONLY`` otherwise (one output per request, when it finishes).
``merged_outputs`` runs them concurrently and yields ``(sub, output)`` in arrival order;
if the consumer stops early or one of them fails, all the others are cancelled, which
aborts them in the engine (``AsyncEngine.generate`` contract) and frees their blocks.
Each engine request uses one slot of the HTTP request's ``Admission`` (reserved by the
handler, which releases what is left when it is done).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from starlette.requests import Request

from execstate.engine.async_engine import Admission, AsyncEngine
from execstate.engine.outputs import Logprob, RequestOutput
from execstate.engine.sampling_params import RequestOutputKind, SamplingParams
from execstate.identity.scope import LOCAL_SCOPE, CacheScope
from execstate.serve.errors import OpenAIError
from execstate.serve.metrics import ServingMetrics
from execstate.serve.openai.protocol import PromptTokensDetails, Usage
from execstate.transfer.handoff import Handoff

T = TypeVar("T")


@dataclass(frozen=True)
class PromptScores:
    """The prompt's logprobs (``serve/openai/prompt_scores.py``): per token its entry (``None`` for
    the first) and its text."""

    entries: list[dict[int, Logprob] | None]
    texts: list[str]


@dataclass(frozen=True)
class PromptInput:
    token_ids: list[int]
    text: str | None
    scores: PromptScores | None = None  # when prompt_logprobs or echo with logprobs ask for them


@dataclass(frozen=True)
class SubRequest:
    index: int
    prompt_index: int
    prompt: PromptInput
    params: SamplingParams
    request_id: str
    kv_transfer_params: dict[str, Any] | Handoff | None
    scope: CacheScope = LOCAL_SCOPE  # the caller's tenant (or shared group) and the body's cache_salt


def expand(
    base_id: str, prompts: list[PromptInput], params: SamplingParams, n: int,
    kv_transfer_params: dict[str, Any] | Handoff | None, scope: CacheScope = LOCAL_SCOPE, *,
    output_kind: RequestOutputKind,
) -> list[SubRequest]:
    subs = []
    for p, prompt in enumerate(prompts):
        for j in range(n):
            seed = None if params.seed is None else params.seed + j
            sub_params = replace(params, n=1, seed=seed, output_kind=output_kind)
            subs.append(SubRequest(p * n + j, p, prompt, sub_params, f"{base_id}-{p}-{j}", kv_transfer_params,
                                   scope))
    return subs


async def merged_outputs(
    engine: AsyncEngine, subs: list[SubRequest], metrics: ServingMetrics, arrival: float,
    admission: Admission | None = None,
) -> AsyncIterator[tuple[SubRequest, RequestOutput]]:
    """Yield every output of every sub-request; raises the first error of any of them."""
    results: asyncio.Queue[tuple[SubRequest, RequestOutput | BaseException | None]] = asyncio.Queue()

    async def pump(sub: SubRequest) -> None:
        timer = metrics.timer(arrival)
        prompt = {"prompt_token_ids": sub.prompt.token_ids, "prompt": sub.prompt.text}
        try:
            gen = engine.generate(prompt, sub.params, sub.request_id, sub.kv_transfer_params, admission, sub.scope)
            async with aclosing(gen):
                async for out in gen:
                    if out.finished and out.error is not None:
                        # request-level failure (e.g. PD KV load under policy "fail")
                        raise OpenAIError(500, out.error, code="request_failed")
                    timer.on_output(out)
                    results.put_nowait((sub, out))
            results.put_nowait((sub, None))
        except Exception as exc:  # delivered to the consumer, which cancels the rest
            results.put_nowait((sub, exc))
        finally:
            timer.on_abandoned()  # no-op when it finished

    tasks = [asyncio.create_task(pump(s)) for s in subs]
    try:
        pending = len(tasks)
        while pending:
            sub, item = await results.get()
            if item is None:
                pending -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield sub, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def final_outputs(
    engine: AsyncEngine, subs: list[SubRequest], metrics: ServingMetrics, arrival: float,
    admission: Admission | None = None,
) -> list[RequestOutput]:
    """Run to completion; the final output of each sub-request, in choice order."""
    finals: dict[int, RequestOutput] = {}
    async with aclosing(merged_outputs(engine, subs, metrics, arrival, admission)) as stream:
        async for sub, out in stream:
            if out.finished:
                finals[sub.index] = out
    return [finals[s.index] for s in subs]


async def cancel_on_disconnect(request: Request, work: Awaitable[T]) -> T | None:
    """Await ``work`` unless the client disconnects first (then cancel it, return None)."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this handler was cancelled itself
        task.cancel()
        watcher.cancel()
        raise
    watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return None


def usage_of(
    subs: list[SubRequest], finals: dict[int, RequestOutput], completion_tokens: dict[int, int] | None = None
) -> Usage:
    """Token counts: each prompt once (its least-cached choice), every completion token.

    ``completion_tokens`` (by choice index) counts what a stream received; without it the
    final outputs (``FINAL_ONLY``) hold every token.
    """
    prompt_tokens = cached = completion = 0
    sources: dict[str, int] = {"local_cache": 0, "offloaded": 0, "transferred": 0, "computed": 0}
    by_prompt: dict[int, list[RequestOutput]] = {}
    for s in subs:
        out = finals.get(s.index)
        if out is not None:
            by_prompt.setdefault(s.prompt_index, []).append(out)
            n = completion_tokens.get(s.index, 0) if completion_tokens is not None else len(out.outputs[0].token_ids)
            completion += n
    for outs in by_prompt.values():
        least = min(outs, key=lambda o: o.num_cached_tokens)
        prompt_tokens += len(least.prompt_token_ids)
        cached += least.num_cached_tokens
        for k, v in least.prompt_token_sources.items():
            sources[k] = sources.get(k, 0) + v
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion,
        total_tokens=prompt_tokens + completion,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
        prompt_token_sources=sources,
    )

"""Logprobs of the prompt's tokens: vLLM's ``prompt_logprobs`` and ``echo`` with ``logprobs``.

``score_prompts`` scores each prompt through the scheduler like any prefill: one engine request
per prompt with ``prompt_logprobs`` (``engine/prompt_logprobs.py``: at most
``--prompt-logprobs-chunk-tokens`` of it per step, its logits reduced block by block, so the
requests beside it keep getting tokens and memory stays bounded), one greedy token generated and
dropped. The prompt's blocks stay in the prefix cache, so a generation that follows (``max_tokens``
> 0) does not prefill it again. The logprobs are ``LLM.score``'s on the same tokens (bit for bit on
execstate's CPU kernels). The entries are built and decoded in a prompt worker, never on the
engine thread or the event loop. A prompt longer than ``--max-logprobs-prompt-tokens``
(``ServingLimits.max_logprobs_prompt_tokens``) is a 400 before anything runs.

The first token has no logprob (``None``). ``vllm_prompt_logprobs`` is vLLM's response layout (per
token, ``{token id: {logprob, rank, decoded_token}}``); ``echo_logprobs`` the completions layout of
the prompt's part of an echoed choice (``token_logprobs[0]`` and ``top_logprobs[0]`` are ``null``).
"""

from __future__ import annotations

from dataclasses import replace

from execstate.engine.async_engine import EngineDeadError
from execstate.engine.outputs import Logprob, PromptLogprobs
from execstate.engine.sampling_params import RequestOutputKind, SamplingParams
from execstate.engine.tokenizer import Tokenizer
from execstate.identity.scope import CacheScope
from execstate.serve.context import ServeContext, engine_dead, new_request_id
from execstate.serve.errors import OpenAIError, bad_request
from execstate.serve.limits import option_name
from execstate.serve.openai.generation import PromptInput, PromptScores
from execstate.serve.openai.protocol import CompletionLogprobs, PromptLogprob
from execstate.serve.openai.protocol import PromptLogprobs as PromptLogprobsBody

Entries = list[dict[int, Logprob] | None]


def check_scored_lengths(ctx: ServeContext, prompts: list[PromptInput]) -> None:
    """400 for a prompt longer than the server scores (``max_logprobs_prompt_tokens``)."""
    cap = ctx.limits.max_logprobs_prompt_tokens
    for i, p in enumerate(prompts):
        if len(p.token_ids) > cap:
            raise bad_request(f"prompt {i} has {len(p.token_ids)} tokens: this server scores prompts (echo with "
                              f"logprobs, prompt_logprobs) of at most {cap} tokens "
                              f"({option_name('max_logprobs_prompt_tokens')})", param="prompt_logprobs")


async def score_prompts(ctx: ServeContext, prompts: list[PromptInput], k: int,
                        scope: CacheScope | None = None) -> list[PromptInput]:
    """``prompts`` with their ``scores``: each token's entry, ``k`` alternatives per position;
    ``scope``: the request's cache scope (its blocks are cached there, for the generation after)."""
    check_scored_lengths(ctx, prompts)
    out = []
    for p in prompts:
        scores = await _score(ctx, p, k, scope)
        out.append(replace(p, scores=await ctx.in_worker(_decoded, ctx.engine.tokenizer, p.token_ids, scores)))
    return out


async def _score(ctx: ServeContext, p: PromptInput, k: int, scope: CacheScope | None) -> PromptLogprobs:
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, prompt_logprobs=k,
                            output_kind=RequestOutputKind.FINAL_ONLY)
    prompt = {"prompt_token_ids": p.token_ids, "prompt": p.text}
    ticket = ctx.admit(1)
    final = None
    try:
        async for out in ctx.engine.generate(prompt, params, new_request_id("score"), None, ticket, scope):
            final = out
    except EngineDeadError as exc:
        raise engine_dead(exc) from None
    finally:
        ctx.engine.release(ticket)
    if final is None or final.prompt_logprobs is None:
        why = final.error if final is not None and final.error else "the scoring request ended without its scores"
        raise OpenAIError(500, f"scoring the prompt failed: {why}", code="request_failed")
    return final.prompt_logprobs


def _decoded(tok: Tokenizer | None, token_ids: list[int], scores: PromptLogprobs) -> PromptScores:
    entries = scores.entries()
    cache: dict[int, str] = {}

    def text(t: int) -> str:
        if t not in cache:
            cache[t] = tok.decode([t], skip_special_tokens=False) if tok is not None else f"token_id:{t}"
        return cache[t]

    decoded = [None if e is None else {t: replace(lp, decoded_token=text(t)) for t, lp in e.items()} for e in entries]
    return PromptScores(decoded, [text(t) for t in token_ids])


def vllm_prompt_logprobs(scores: PromptScores) -> PromptLogprobsBody:
    return [None if e is None else {t: PromptLogprob(logprob=lp.logprob, rank=lp.rank, decoded_token=lp.decoded_token)
                                    for t, lp in e.items()} for e in scores.entries]


def echo_logprobs(token_ids: list[int], scores: PromptScores, top: int) -> CompletionLogprobs:
    """The completions logprobs of an echoed prompt (offsets from 0)."""
    out = CompletionLogprobs()
    offset = 0
    for tok, e, text in zip(token_ids, scores.entries, scores.texts, strict=True):
        out.tokens.append(text)
        out.text_offset.append(offset)
        offset += len(text)
        if e is None:
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
            continue
        out.token_logprobs.append(e[tok].logprob)
        alts = sorted(((t, lp) for t, lp in e.items() if lp.rank <= top), key=lambda x: x[1].rank)
        out.top_logprobs.append({(lp.decoded_token or f"token_id:{t}"): lp.logprob for t, lp in alts[:top]})
    return out

"""Logprobs of the prompt's tokens: vLLM's ``prompt_logprobs`` and ``echo`` with ``logprobs``.

``score_prompts`` runs ``engine/scorer.prompt_logprobs`` on the engine thread, between steps
(one dense forward pass over the prompt, as ``LLM.score``: the logprobs are ``LLM.score``'s on
the same tokens, bit for bit), then decodes the tokens it reports in a prompt worker. The first
token has no logprob (``None``). ``vllm_prompt_logprobs`` is vLLM's response layout (per token,
``{token id: {logprob, rank, decoded_token}}``); ``echo_logprobs`` the completions layout of the
prompt's part of an echoed choice (``token_logprobs[0]`` and ``top_logprobs[0]`` are ``null``).
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

from execstate.engine.outputs import Logprob
from execstate.engine.scorer import prompt_logprobs
from execstate.engine.tokenizer import Tokenizer
from execstate.serve.context import ServeContext
from execstate.serve.openai.generation import PromptInput, PromptScores
from execstate.serve.openai.protocol import CompletionLogprobs, PromptLogprob, PromptLogprobs

if TYPE_CHECKING:
    from execstate.engine.llm_engine import LLMEngine

Entries = list[dict[int, Logprob] | None]


async def score_prompts(ctx: ServeContext, prompts: list[PromptInput], k: int) -> list[PromptInput]:
    """``prompts`` with their ``scores``: each token's entry, ``k`` alternatives per position."""
    out = []
    for p in prompts:
        entries = await ctx.engine.run_on_engine(partial(_score, p.token_ids, k))
        out.append(replace(p, scores=await ctx.in_worker(_decoded, ctx.engine.tokenizer, p.token_ids, entries)))
    return out


def _score(token_ids: list[int], k: int, engine: LLMEngine) -> Entries:
    return prompt_logprobs(engine, token_ids, k)


def _decoded(tok: Tokenizer | None, token_ids: list[int], entries: Entries) -> PromptScores:
    cache: dict[int, str] = {}

    def text(t: int) -> str:
        if t not in cache:
            cache[t] = tok.decode([t], skip_special_tokens=False) if tok is not None else f"token_id:{t}"
        return cache[t]

    decoded = [None if e is None else {t: replace(lp, decoded_token=text(t)) for t, lp in e.items()} for e in entries]
    return PromptScores(decoded, [text(t) for t in token_ids])


def vllm_prompt_logprobs(scores: PromptScores) -> PromptLogprobs:
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

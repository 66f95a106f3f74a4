"""HTTP request bodies -> engine inputs, engine logprobs -> OpenAI logprobs.

Everything a request can get wrong is checked here, before any engine request exists,
and raised as a 400 ``OpenAIError`` naming the parameter: unsupported OpenAI features at
non-neutral values, sampling ranges (``SamplingParams`` validation), ``logit_bias`` keys
that are not token ids of the vocabulary, prompts that are
empty, too long or hold ids outside the vocabulary, and ``max_tokens`` that cannot fit
after the prompt. Bounds set by the server (``n``, ``logprobs``, stop strings...) are
checked by ``limit_checks.check_limits``. Tokenisation uses the engine's immutable tokenizer on the
caller's thread, exactly as ``LLM.generate`` (text prompts) and ``LLM.chat`` (chat) do;
the HTTP handlers call ``completion_prompts`` and ``chat_prompt`` in a worker thread.
"""

from __future__ import annotations

import re
from typing import Any, cast

import jinja2

from execstate.engine.grammar.spec import StructuredOutputsParams
from execstate.engine.outputs import Logprob
from execstate.engine.sampling_params import SamplingParams
from execstate.engine.tokenizer import Tokenizer
from execstate.engine.validation import validate_logit_bias, validate_prompt
from execstate.serve.errors import bad_request, param_of
from execstate.serve.openai.generation import PromptInput
from execstate.serve.openai.protocol import (
    ChatCompletionRequest,
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionLogprobs,
    CompletionRequest,
    SamplingRequest,
    TopLogprob,
)
from execstate.serve.openai.tools import ToolRequest, prompt_messages


def check_unsupported(req: SamplingRequest) -> None:
    def no(param: str, why: str = "is not supported by this server") -> None:
        raise bad_request(f"{param} {why}", param=param)

    if isinstance(req, CompletionRequest):
        if req.suffix:
            no("suffix")
        if req.best_of is not None and req.best_of != req.n:
            no("best_of", "must equal n (best_of sampling is not supported)")
    if req.kv_transfer_params is not None and req.n != 1:
        no("kv_transfer_params", "needs n=1 (one engine request per PD handoff)")


def sampling_params(req: SamplingRequest, max_tokens: int | None, logprobs: int | None,
                    structured_outputs: StructuredOutputsParams | None = None) -> SamplingParams:
    if req.seed is not None and not -(2**63) <= req.seed < 2**64:
        raise bad_request(f"seed must fit in 64 bits, got {req.seed}", param="seed")
    try:
        return SamplingParams(
            n=req.n,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            min_p=req.min_p,
            repetition_penalty=req.repetition_penalty,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            logit_bias=_logit_bias(req.logit_bias),
            seed=req.seed,
            max_tokens=max_tokens,
            min_tokens=req.min_tokens,
            stop=[req.stop] if isinstance(req.stop, str) else req.stop,
            stop_token_ids=req.stop_token_ids,
            ignore_eos=req.ignore_eos,
            logprobs=logprobs,
            routed_experts_prompt_start=req.routed_experts_prompt_start,
            structured_outputs=structured_outputs,
        )
    except ValueError as exc:
        raise bad_request(str(exc), param=param_of(str(exc))) from None


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI sends ``{"token id": bias}``; the engine takes int ids."""
    if not bias:
        return None
    out = {}
    for key, value in bias.items():
        if not re.fullmatch(r"[0-9]+", key.strip()):
            raise bad_request(f"logit_bias keys must be token ids (integers >= 0), got {key!r}", param="logit_bias")
        out[int(key)] = value
    return out


def check_logit_bias(params: SamplingParams, vocab_size: int) -> None:
    """``logit_bias`` keys inside the vocabulary (400 naming logit_bias)."""
    try:
        validate_logit_bias(params.logit_bias, vocab_size)
    except ValueError as exc:
        raise bad_request(str(exc), param="logit_bias") from None


def completion_prompts(
    req: CompletionRequest, tokenizer: Tokenizer | None, max_model_len: int | None = None
) -> list[PromptInput]:
    """``prompt``: text, token ids, or a list of either (one choice group per prompt). With
    ``max_model_len``, a text prompt that cannot fit is refused as soon as it is tokenised."""
    p = req.prompt
    single = isinstance(p, str) or (isinstance(p, list) and all(isinstance(t, int) for t in p))
    items = cast("list[str | list[int]]", [p] if single else list(p))  # single: one prompt, else a list of them
    if not items:
        raise bad_request("prompt is empty: at least one prompt is required", param="prompt")
    out = []
    for item in items:
        if isinstance(item, str):
            if tokenizer is None:
                raise bad_request("this model has no tokenizer: send token ids as the prompt", param="prompt")
            out.append(PromptInput(_encode(tokenizer, item, True, max_model_len), item))
        else:
            out.append(PromptInput([int(t) for t in item], None))
    return out


def chat_prompt(
    req: ChatCompletionRequest, tokenizer: Tokenizer | None, max_model_len: int | None = None,
    tools: ToolRequest | None = None,
) -> PromptInput:
    if tokenizer is None:
        raise bad_request("this model has no tokenizer; chat completions need one", param="messages")
    messages = [_message(i, m.model_dump()) for i, m in enumerate(req.messages)]
    messages, template_args = prompt_messages(messages, tools, tokenizer.chat_template)
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=req.add_generation_prompt,
                                             **template_args)
    except (ValueError, jinja2.TemplateError) as exc:
        raise bad_request(f"cannot apply the chat template: {exc}", param="messages") from None
    return PromptInput(_encode(tokenizer, text, False, max_model_len), text)


def _encode(tokenizer: Tokenizer, text: str, add_special_tokens: bool, max_model_len: int | None) -> list[int]:
    try:
        return tokenizer.encode(text, add_special_tokens=add_special_tokens, max_model_len=max_model_len)
    except ValueError as exc:  # too long for the context
        raise bad_request(str(exc), param="prompt") from None


ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


def _message(i: int, m: dict[str, Any]) -> dict[str, Any]:
    """One message as the template gets it (text parts joined); 400 naming ``messages[i]`` for an
    unknown role, a ``tool`` message without a string ``tool_call_id``, or ``null`` content (which
    only an assistant message with ``tool_calls`` may have, as in OpenAI's API)."""
    role, content = m.get("role"), m.get("content")
    if role not in ROLES:
        raise bad_request(f"messages[{i}].role must be one of {sorted(ROLES)}, got {role!r}", param="messages")
    if role == "tool" and not isinstance(m.get("tool_call_id"), str):
        raise bad_request(f"messages[{i}]: a tool message needs tool_call_id (a string): the id of the call it "
                          "answers", param="messages")
    if content is None:
        if role != "assistant" or not m.get("tool_calls"):
            raise bad_request(f"messages[{i}].content is null: only an assistant message with tool_calls may omit "
                              "its content", param="messages")
        m["content"] = ""
    elif isinstance(content, list):
        texts = []
        for part in content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad_request(f"messages[{i}]: only text content parts are supported", param="messages")
            texts.append(part["text"])
        m["content"] = "".join(texts)
    return m


def validate_prompts(
    prompts: list[PromptInput], vocab_size: int, max_model_len: int, max_tokens: int | None
) -> None:
    for p in prompts:
        try:
            validate_prompt(p.token_ids, vocab_size, max_model_len)
        except ValueError as exc:
            raise bad_request(str(exc), param="prompt") from None
        if max_tokens is not None and len(p.token_ids) + max_tokens > max_model_len:
            raise bad_request(
                f"this model's maximum context length is {max_model_len} tokens, but {len(p.token_ids)} prompt "
                f"tokens + max_tokens={max_tokens} were requested",
                param="max_tokens",
            )


def _token_text(token_id: int, lp: Logprob) -> str:
    return lp.decoded_token if lp.decoded_token is not None else f"token_id:{token_id}"


def completion_logprobs(
    token_ids: list[int], entries: list[dict[int, Logprob]], text_offset: int
) -> CompletionLogprobs:
    """OpenAI completions logprobs for these tokens; offsets start at ``text_offset``."""
    out = CompletionLogprobs()
    for tok, entry in zip(token_ids, entries, strict=True):
        text = _token_text(tok, entry[tok])
        out.tokens.append(text)
        out.token_logprobs.append(entry[tok].logprob)
        out.top_logprobs.append({_token_text(t, lp): lp.logprob for t, lp in entry.items()})
        out.text_offset.append(text_offset)
        text_offset += len(text)
    return out


def chat_logprobs(token_ids: list[int], entries: list[dict[int, Logprob]], top: int) -> ChatLogprobs:
    out = ChatLogprobs()
    for tok, entry in zip(token_ids, entries, strict=True):
        alts = sorted(((t, lp) for t, lp in entry.items() if lp.rank <= top), key=lambda x: x[1].rank)
        text = _token_text(tok, entry[tok])
        out.content.append(
            ChatTokenLogprob(
                token=text, logprob=entry[tok].logprob, bytes=list(text.encode()),
                top_logprobs=[_top(t, lp) for t, lp in alts[:top]],
            )
        )
    return out


def _top(token_id: int, lp: Logprob) -> TopLogprob:
    text = _token_text(token_id, lp)
    return TopLogprob(token=text, logprob=lp.logprob, bytes=list(text.encode()))

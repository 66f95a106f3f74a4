"""``POST /tokenize``, ``POST /detokenize``, ``GET /tokenizer_info`` and ``GET /version`` (vLLM's shapes).

- ``/tokenize``: ``{"prompt": str, "add_special_tokens": true}`` or, for chat,
  ``{"messages": [...], "add_generation_prompt": true, "add_special_tokens": false, "tools": [...]}``
  (the prompt ``/v1/chat/completions`` would run: same template, same tool declarations);
  ``return_token_strs`` adds each token's string. Answer: ``{"count", "max_model_len", "tokens",
  "token_strs"}``.
- ``/detokenize``: ``{"tokens": [...]}`` -> ``{"prompt": str}``; ids outside the vocabulary: 400.
- ``/tokenizer_info``: the special tokens, the chat template and ``model_max_length`` (what
  lm-evaluation-harness's remote tokenizer reads: with ``/tokenize`` and ``/detokenize`` it
  tokenises with the server's own tokenizer, nothing downloaded).
- ``/version``: ``{"version": execstate's version}``.

``model`` is optional; when given it must be the served name. Tokenising and templating run in the
prompt workers, never on the event loop.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from execstate.serve.context import ServeContext
from execstate.serve.errors import bad_request
from execstate.serve.openai.convert import chat_prompt, completion_prompts
from execstate.serve.openai.protocol import ChatCompletionRequest, ChatMessage, CompletionRequest
from execstate.serve.openai.tools import tool_request


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    tools: list[dict[str, Any]] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    tokens: list[int] = Field(default_factory=list)


def install_tokenize_routes(app: FastAPI, ctx: ServeContext) -> None:
    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> JSONResponse:
        _check_model(ctx, body.model)
        if (body.prompt is None) == (body.messages is None):
            raise bad_request("give exactly one of prompt or messages", param="prompt")
        if body.messages is not None and not body.messages:
            raise bad_request("messages must not be empty", param="messages")
        ids = await ctx.in_worker(_tokenize, ctx, body)
        tok = ctx.engine.tokenizer
        assert tok is not None
        strs = [tok.id_to_token(t) for t in ids] if body.return_token_strs else None
        return JSONResponse({"count": len(ids), "max_model_len": ctx.engine.max_model_len, "tokens": ids,
                             "token_strs": strs})

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> JSONResponse:
        _check_model(ctx, body.model)
        vocab = ctx.engine.model_config.vocab_size
        bad = [t for t in body.tokens if not 0 <= t < vocab]
        if bad:
            raise bad_request(f"token id {bad[0]} is outside the vocabulary [0, {vocab})", param="tokens")
        tok = ctx.engine.tokenizer
        if tok is None:
            raise bad_request("this model has no tokenizer", param="tokens")
        return JSONResponse({"prompt": await ctx.in_worker(tok.decode, body.tokens)})

    @app.get("/tokenizer_info")
    async def tokenizer_info() -> JSONResponse:
        _check_model(ctx, None)
        tok = ctx.engine.tokenizer
        assert tok is not None
        return JSONResponse({"tokenizer_class": "execstate", "eos_token": tok.eos_token, "bos_token": tok.bos_token,
                             "pad_token": None, "chat_template": tok.chat_template,
                             "model_max_length": ctx.engine.max_model_len})

    @app.get("/version")
    async def server_version() -> JSONResponse:
        try:
            v = version("execstate")
        except PackageNotFoundError:  # running from a source tree that was not installed
            v = "unknown"
        return JSONResponse({"version": v})


def _check_model(ctx: ServeContext, model: str | None) -> None:
    if model is not None:
        ctx.check_request(model)
    if ctx.engine.tokenizer is None:
        raise bad_request("this model has no tokenizer", param="model")


def _tokenize(ctx: ServeContext, body: TokenizeRequest) -> list[int]:
    eng = ctx.engine
    if body.prompt is not None:
        req = CompletionRequest(model=ctx.served_model_name, prompt=body.prompt)
        ids = completion_prompts(req, eng.tokenizer, eng.max_model_len)[0].token_ids
        if body.add_special_tokens is False:  # completion prompts are encoded with them
            assert eng.tokenizer is not None
            ids = eng.tokenizer.encode(body.prompt, add_special_tokens=False, max_model_len=eng.max_model_len)
        return ids
    chat = ChatCompletionRequest(model=ctx.served_model_name, messages=body.messages or [], tools=body.tools,
                                 add_generation_prompt=body.add_generation_prompt)
    prompt = chat_prompt(chat, eng.tokenizer, eng.max_model_len, tool_request(chat))
    if body.add_special_tokens:
        assert eng.tokenizer is not None and prompt.text is not None
        return eng.tokenizer.encode(prompt.text, add_special_tokens=True, max_model_len=eng.max_model_len)
    return prompt.token_ids

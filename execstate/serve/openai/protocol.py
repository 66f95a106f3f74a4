"""OpenAI-compatible request and response bodies (field names follow OpenAI and vLLM).

Requests accept unknown fields and ignore them, as OpenAI-compatible servers (vLLM) do:
clients send OpenAI fields this server has no use for (``store``, ``metadata``,
``service_tier``...). They are not silent: ``ignored_fields`` names them, and the app
lists them in the ``X-Ignored-Fields`` response header and the log, so a typo such as
``routed_experts_prompt_strat`` is visible to an RL stack. OpenAI fields this server
does not implement are accepted at their neutral values only (see
``convert.check_unsupported``). Sampling fields: OpenAI's ``presence_penalty``, ``frequency_penalty`` and
``logit_bias`` (keys are token ids as strings), vLLM's ``repetition_penalty`` and ``min_p``.

Extensions, as in vLLM: ``top_k``, ``min_p``, ``repetition_penalty``, ``min_tokens``, ``ignore_eos``,
``stop_token_ids``,
``return_token_ids``, ``kv_transfer_params`` (PD handoff, passed to the engine and
returned top-level), ``cache_salt`` (per-tenant prefix cache), and R3's ``return_routed_experts`` and
``routed_experts_prompt_start`` (request) / ``routed_experts`` (each choice: base64 of ``numpy.save`` bytes,
docs/contracts.md 4; returned as ``ServeContext.wants_routes`` says). Response
extensions that were not asked for are omitted rather than sent as ``null``.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_serializer

from execstate.identity.scope import cache_salt

Prompt = str | list[int] | list[str] | list[list[int]]


class _Response(BaseModel):
    """Dumps every field, except those in ``omit_if_none`` whose value is ``None``."""

    omit_if_none: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _omit(self, handler: Any) -> dict[str, Any]:
        d = handler(self)
        return {k: v for k, v in d.items() if not (v is None and k in self.omit_if_none)}


# -- requests -------------------------------------------------------------------------------------
class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class SamplingRequest(BaseModel):
    """Fields shared by completions and chat completions."""

    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    # vLLM extensions.
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    min_tokens: int = 0
    return_token_ids: bool = False
    # R3 and PD. return_routed_experts (SGLang's request field): true asks for each choice's routes,
    # false leaves them out; absent, the server's default (context.ServeContext.wants_routes).
    return_routed_experts: bool | None = None
    routed_experts_prompt_start: int = 0
    kv_transfer_params: dict[str, Any] | None = None
    # vLLM's name: narrows the caller's cache partition (identity/scope.py); never crosses tenants.
    cache_salt: str | None = None
    # Structured outputs (serve/openai/structured.py): OpenAI's response_format, vLLM's
    # structured_outputs ({"json" | "regex" | "choice" | "grammar" | "json_object": ...}).
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    # vLLM: logprobs of the prompt's tokens (their own and this many alternatives per position).
    prompt_logprobs: int | None = None

    @field_validator("cache_salt")
    @classmethod
    def _check_cache_salt(cls, v: str | None) -> str | None:
        return cache_salt(v)

    @field_validator(
        "temperature", "top_p", "n", "min_tokens", "ignore_eos", "return_token_ids",
        "frequency_penalty", "presence_penalty", "min_p", "repetition_penalty", mode="before",
    )
    @classmethod
    def _null_is_default(cls, v: Any, info: ValidationInfo) -> Any:
        """Some clients send ``null`` for "not given"."""
        name = cast(str, info.field_name)  # a field validator's info names its field
        return cls.model_fields[name].default if v is None else v


class CompletionRequest(SamplingRequest):
    prompt: Prompt
    max_tokens: int | None = 16  # 0: no generation (with echo or prompt_logprobs: score the prompt)
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None


class ChatMessage(BaseModel):
    """One message; extra keys (``name``, ``tool_calls``...) reach the chat template as-is."""

    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None


def ignored_fields(req: SamplingRequest) -> list[str]:
    """The request's unknown fields (accepted and ignored), nested ones as ``parent.name``."""
    names = list(req.model_extra or {})
    if req.stream_options is not None:
        names += [f"stream_options.{k}" for k in req.stream_options.model_extra or {}]
    return names


# -- responses ------------------------------------------------------------------------------------
class PromptTokensDetails(BaseModel):
    cached_tokens: int


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    # Where the prompt's KV came from: {"local_cache", "offloaded", "transferred", "computed"}
    # (engine's counts).
    prompt_token_sources: dict[str, int]


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)  # None: an echoed prompt's first token
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class PromptLogprob(BaseModel):
    """vLLM's entry of ``prompt_logprobs`` (keyed by token id)."""

    logprob: float
    rank: int
    decoded_token: str | None = None


PromptLogprobs = list[dict[int, PromptLogprob] | None]


class CompletionChoice(_Response):
    omit_if_none: ClassVar[frozenset[str]] = frozenset(
        {"routed_experts", "token_ids", "prompt_token_ids", "prompt_logprobs"})
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    routed_experts: str | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    prompt_logprobs: PromptLogprobs | None = None


class CompletionResponse(_Response):
    omit_if_none: ClassVar[frozenset[str]] = frozenset({"usage"})
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    kv_transfer_params: dict[str, Any] | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] = Field(default_factory=list)


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class DeltaToolCall(BaseModel):
    """A streamed call: sent whole, once its block is complete (index: its place in the message)."""

    index: int
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class DeltaMessage(_Response):
    omit_if_none: ClassVar[frozenset[str]] = frozenset({"role", "content", "tool_calls"})
    role: str | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class AssistantMessage(_Response):
    omit_if_none: ClassVar[frozenset[str]] = frozenset({"tool_calls"})
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCallOut] | None = None


class _ChatChoiceFields(_Response):
    """What a chat choice carries besides its message (whole) or delta (streamed)."""

    omit_if_none: ClassVar[frozenset[str]] = frozenset({"routed_experts", "token_ids"})
    index: int
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    routed_experts: str | None = None
    token_ids: list[int] | None = None


class ChatChoice(_ChatChoiceFields):
    message: AssistantMessage


class ChatStreamChoice(_ChatChoiceFields):
    delta: DeltaMessage


class ChatCompletionResponse(_Response):
    omit_if_none: ClassVar[frozenset[str]] = frozenset({"usage", "prompt_token_ids", "prompt_logprobs"})
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None
    prompt_token_ids: list[int] | None = None
    kv_transfer_params: dict[str, Any] | None = None
    prompt_logprobs: PromptLogprobs | None = None


class ChatCompletionChunk(_Response):
    omit_if_none: ClassVar[frozenset[str]] = frozenset(
        {"usage", "prompt_token_ids", "kv_transfer_params", "prompt_logprobs"})
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatStreamChoice]
    usage: Usage | None = None
    prompt_token_ids: list[int] | None = None
    kv_transfer_params: dict[str, Any] | None = None
    prompt_logprobs: PromptLogprobs | None = None  # the first chunk of each choice


class CompletionChunk(_Response):
    omit_if_none: ClassVar[frozenset[str]] = frozenset({"usage", "kv_transfer_params"})
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    kv_transfer_params: dict[str, Any] | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "execstate"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]

"""Request intake: a prompt or a session step in, a validated engine ``Request`` out.

:class:`RequestIntake` is built by ``LLMEngine`` with what a request is checked against (the
model's config, ``max_model_len``, the tokenizer) and what it is given (route traces when the
engine returns routes, the engine's generator for unseeded sampling, the KV holds a session
step's blocks live in). It changes nothing in the engine: it validates (``ValueError``, naming
what is wrong) and builds; the engine registers the request and queues it.

- ``tokenize_prompt``: a string (the tokenizer's encoding), a list of ids, or a dict with
  ``prompt_token_ids`` / ``prompt``.
- ``build``: one request of ``LLMEngine.add_request`` (checks in this order: sampling, prompt,
  logit bias, cache scope, forced routes, the structured output constraint (compiled, or taken
  from the compiler's cache, into a fresh matcher), then the PD handoff through ``accept_handoff``).
- ``build_step``: one session step (``engine/step_request.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import replace
from typing import Any

import torch

from execstate.engine.grammar.compiler import GrammarCompiler
from execstate.engine.grammar.matcher import GrammarMatcher
from execstate.engine.penalties import PenaltyState
from execstate.engine.prompt_logprobs import PromptScoring
from execstate.engine.request import Request
from execstate.engine.route_trace import RouteTrace
from execstate.engine.sampling_params import SamplingParams
from execstate.engine.sampling_state import SamplingState
from execstate.engine.step_request import StepRequest, build_step_request
from execstate.engine.tokenizer import Tokenizer
from execstate.engine.transfer_state import TransferState
from execstate.engine.validation import (
    validate_forced_routes,
    validate_logit_bias,
    validate_prompt,
    validate_sampling,
)
from execstate.identity.scope import LOCAL_SCOPE, CacheScope, cache_salt
from execstate.model.config import ModelConfig
from execstate.state.block_holds import BlockHolds
from execstate.transfer.handoff import Handoff

PromptType = str | list[int] | dict[str, Any]
# kv_transfer_params as add_request takes them -> the trusted handoff to load from, or None
HandoffCheck = Callable[[dict[str, Any] | Handoff | None], Handoff | None]


def request_scope(prompt: PromptType, scope: CacheScope | None) -> CacheScope:
    """The typed scope of a request: ``scope`` as given, or the local tenant's; a prompt dict's
    ``cache_salt`` (vLLM's offline spelling) becomes its salt. ``ValueError`` for a bad salt, or a
    salt given both ways."""
    salt = cache_salt(prompt.get("cache_salt")) if isinstance(prompt, dict) else None
    if salt is None:
        return scope or LOCAL_SCOPE
    if scope is not None and scope.salt is not None:
        raise ValueError("cache_salt is given twice (in the prompt and in the request's scope)")
    return (scope or LOCAL_SCOPE).with_salt(salt)


class RequestIntake:
    """Validates and builds requests (module docstring)."""

    def __init__(self, model_config: ModelConfig, max_model_len: int, tokenizer: Tokenizer | None,
                 return_routes: bool, generator: torch.Generator, kv_holds: BlockHolds,
                 grammar: GrammarCompiler | None = None, prompt_logprobs_chunk_tokens: int | None = None) -> None:
        self.model_config = model_config
        self.max_model_len = max_model_len
        self.tokenizer = tokenizer
        self.return_routes = return_routes
        self._generator = generator
        self._kv_holds = kv_holds
        self._grammar = grammar
        self._prompt_logprobs_chunk = prompt_logprobs_chunk_tokens

    def tokenize_prompt(self, prompt: PromptType) -> tuple[list[int], str | None]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer.json: pass {'prompt_token_ids': [...]}")
            return self.tokenizer.encode(prompt, max_model_len=self.max_model_len), prompt
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return list(prompt["prompt_token_ids"]), prompt.get("prompt")
            if "prompt" in prompt:
                return self.tokenize_prompt(prompt["prompt"])
            raise ValueError("a prompt dict needs 'prompt_token_ids' or 'prompt'")
        if isinstance(prompt, list | tuple):
            return list(prompt), None
        raise ValueError(f"unsupported prompt type {type(prompt).__name__}")

    def build(self, prompt: PromptType, params: SamplingParams, request_id: str,
              kv_transfer_params: dict[str, Any] | Handoff | None, accept_handoff: HandoffCheck,
              scope: CacheScope | None = None) -> Request:
        """The request ``add_request`` queues; ValueError (nothing changed) on bad input."""
        mc = self.model_config
        if params.n != 1:
            raise ValueError("the engine takes n=1 requests; LLM.generate expands n > 1")
        validate_sampling(params, mc.vocab_size)
        token_ids, text = self.tokenize_prompt(prompt)
        validate_prompt(token_ids, mc.vocab_size, self.max_model_len)
        validate_logit_bias(params.logit_bias, mc.vocab_size)
        scope = request_scope(prompt, scope)
        if params.routed_experts is not None:
            forced = validate_forced_routes(
                params.routed_experts, mc.num_moe_layers if mc.is_moe else 0, mc.top_k or 0,
                mc.num_experts or 0, self.max_model_len - 1,
            )
            params = replace(params, routed_experts=forced)
        grammar = self._grammar_matcher(params)
        handoff = accept_handoff(kv_transfer_params)
        req = Request(request_id, [int(t) for t in token_ids], params, self.max_model_len, prompt=text, scope=scope)
        if isinstance(kv_transfer_params, Handoff):
            req.transfer = TransferState(handoff=kv_transfer_params)
        else:
            req.transfer = TransferState(params=kv_transfer_params, handoff=handoff)
        req.grammar = grammar
        if params.prompt_logprobs is not None:
            req.prompt_scoring = PromptScoring(req.prompt_token_ids, params.prompt_logprobs,
                                               self._prompt_logprobs_chunk)
        if self.return_routes or params.routed_experts is not None:
            capacity = len(token_ids) + req.max_new_tokens
            req.routes = RouteTrace(mc.num_moe_layers, mc.top_k, capacity) if self.return_routes else None
        generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else self._generator
        req.sampling = SamplingState(generator, PenaltyState.for_request(params, req.prompt_token_ids,
                                                                         req.output_token_ids, mc.vocab_size))
        return req

    def _grammar_matcher(self, params: SamplingParams) -> GrammarMatcher | None:
        spec = params.structured_outputs
        if spec is None:
            return None
        if self._grammar is None:
            raise ValueError("structured outputs need the model's tokenizer (tokenizer.json)")
        return self._grammar.compile(spec).matcher()

    def build_step(self, step: StepRequest, in_use: Container[str]) -> Request:
        """The request of a session step (``engine/step_request.py``); ``in_use``: live request ids."""
        return build_step_request(step, vocab_size=self.model_config.vocab_size, max_model_len=self.max_model_len,
                                  in_use=in_use, kv_holds=self._kv_holds, return_routes=self.return_routes,
                                  with_text=self.tokenizer is not None)

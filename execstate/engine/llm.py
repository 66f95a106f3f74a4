"""``EngineLLM``: the engine layer's offline API, close to vLLM's ``LLM`` (users take ``execstate.LLM``).

    llm = execstate.LLM(model="smollm2-moe", enable_return_routed_experts=True, seed=0)
    outs = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=32))
    outs[0].outputs[0].routed_experts  # int16[num_tokens - 1, n_moe_layers, top_k]

Sessions (multi-turn contexts with events, checkpoints, rollback, fork) are the session layer's:
``execstate.LLM`` (``session/lm/llm.py``) is this class plus ``open_session``; the engine layer
never imports the session layer.

``model`` is an embedded model name (``execstate models list``) or a directory in
Hugging Face format.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from tqdm import tqdm

from execstate.engine.config import EngineConfig
from execstate.engine.llm_engine import LLMEngine, PromptType
from execstate.engine.outputs import RequestOutput, ScoreOutput
from execstate.engine.sampling_params import RequestOutputKind, SamplingParams
from execstate.engine.scorer import score_tokens
from execstate.engine.tokenizer import Tokenizer
from execstate.engine.validation import validate_prompt, validate_sampling
from execstate.engine.weight_update import UpdatePolicy
from execstate.identity.scope import cache_salt

if TYPE_CHECKING:
    from execstate.engine.pd_config import ImporterFactory


class EngineLLM:
    def __init__(self, model: str | Path, *, make_importer: ImporterFactory | None = None, **kwargs: Any) -> None:
        """``kwargs``: ``EngineConfig``'s fields (``kv_transfer``: a PD connector); ``make_importer``:
        that connector's importer (``LLMEngine``; None: the real one)."""
        self.engine = LLMEngine(EngineConfig(model=model, **kwargs), make_importer=make_importer)

    def get_tokenizer(self) -> Tokenizer | None:
        return self.engine.tokenizer

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Run a batch to completion; outputs come back in prompt order.

        A prompt is a string, a list of token ids or ``{"prompt_token_ids": [...]}`` /
        ``{"prompt": "..."}``, a dict optionally with a ``"cache_salt"`` (vLLM's spelling: the
        salt of the request's scope, ``identity/scope.py``).
        Every prompt is validated before any is queued, so one bad prompt leaves the
        engine untouched. ``n > 1`` expands into n requests (seeds ``seed + j``) that
        share the prompt's cached prefix. Only final outputs are read, so every request
        runs with ``output_kind=FINAL_ONLY`` (whatever the params say, as in vLLM).
        """
        if isinstance(prompts, str | dict) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]
        prompts = list(cast(Sequence[PromptType], prompts))  # a single prompt was wrapped above
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompts):
                raise ValueError(f"{len(prompts)} prompts but {len(params_list)} sampling params")
        eng = self.engine
        tokenized: list[PromptType] = []
        for params in {id(p): p for p in params_list}.values():
            validate_sampling(params, eng.model_config.vocab_size)
        for prompt in prompts:  # tokenize once and validate everything before queuing any
            ids, text = eng.tokenize_prompt(prompt)
            validate_prompt(ids, eng.model_config.vocab_size, eng.max_model_len)
            salt = cache_salt(prompt.get("cache_salt")) if isinstance(prompt, dict) else None
            tokenized.append({"prompt_token_ids": ids, "prompt": text, "cache_salt": salt})
        prompts = tokenized
        groups: list[list[str]] = []
        added: list[str] = []
        try:
            for i, (prompt, params) in enumerate(zip(prompts, params_list, strict=True)):
                rids = []
                for j in range(params.n):
                    sub = _sub_params(params, j)
                    rid = eng.add_request(prompt, sub, request_id=f"gen-{id(self)}-{len(added)}-{i}-{j}")
                    rids.append(rid)
                    added.append(rid)
                groups.append(rids)
        except ValueError:
            for rid in added:
                eng.abort_request(rid)
            raise
        finished: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(added), desc="Processed prompts", disable=not use_tqdm, dynamic_ncols=True)
        try:
            while eng.has_unfinished_requests():
                for out in eng.step():
                    if out.finished:
                        finished[out.request_id] = out
                        bar.update(1)
        finally:
            bar.close()
            for rid in added:
                if rid not in finished:
                    eng.abort_request(rid)
        return [_merge([finished[r] for r in ids]) for ids in groups]

    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        add_generation_prompt: bool = True,
    ) -> list[RequestOutput]:
        """Generate replies to one conversation or a list of them (chat template)."""
        tok = self.engine.tokenizer
        if tok is None:
            raise ValueError("this model has no tokenizer; chat needs one")
        convs = cast(list[list[dict[str, Any]]], [messages] if messages and isinstance(messages[0], dict) else messages)
        prompts: list[PromptType] = []
        for conv in convs:
            text = tok.apply_chat_template(conv, add_generation_prompt=add_generation_prompt)
            prompts.append({"prompt_token_ids": tok.encode(text, add_special_tokens=False), "prompt": text})
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def score(self, token_ids: list[int], routed_experts: np.ndarray | None = None) -> ScoreOutput:
        """Teacher-forced logprobs of ``token_ids``, optionally replaying routes."""
        return score_tokens(self.engine, token_ids, routed_experts)

    def update_weights(
        self, source: str | Path | dict[str, torch.Tensor], weights_version: str | None = None,
        policy: UpdatePolicy = "abort",
    ) -> list[RequestOutput]:
        """New weights in place (see ``LLMEngine.update_weights``); ``weights_version`` skips the hash."""
        return self.engine.update_weights(source, weights_version, policy)

    @property
    def weights_version(self) -> str:
        return self.engine.provenance.weights_version


def _sub_params(params: SamplingParams, j: int) -> SamplingParams:
    final_only = RequestOutputKind.FINAL_ONLY
    if params.n == 1:
        return params if params.output_kind is final_only else replace(params, output_kind=final_only)
    seed = None if params.seed is None else params.seed + j
    return replace(params, n=1, seed=seed, output_kind=final_only)


def _merge(outs: list[RequestOutput]) -> RequestOutput:
    first = outs[0]
    if len(outs) == 1:
        return first
    completions = []
    for j, o in enumerate(outs):
        c = o.outputs[0]
        c.index = j
        completions.append(c)
    first.outputs = completions
    first.num_cached_tokens = min(o.num_cached_tokens for o in outs)
    return first

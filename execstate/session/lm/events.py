"""The event kinds of an LM session (docs/contracts.md 6; the queue: ``session/runtime/events.py``).

- ``input`` (``Merge.APPEND``): ``{"token_ids": [int, ...]}`` or ``{"text": str}`` with an
  optional ``"add_special_tokens": bool`` (default False; the shorthand ``step("text")`` on an
  empty session sets it, as ``LLM.generate("text")`` would). Every input event of a boundary is
  appended to the context in id order. Payload after validation: a tuple of token ids.
- ``sampling`` (``Merge.REPLACE``): ``{field: value, ...}`` with fields of ``SamplingParams``
  listed in :data:`SAMPLING_FIELDS`: the session's sampling parameters for this step and the
  following ones. Last write wins within one step; the overwritten event is completed unapplied.
  ``structured_outputs`` is ``{"json" | "regex" | "choice" | "grammar" | "json_object": ...}``
  (checked against the grammar bounds here; compiled when a step starts) or None.

Validation happens at submission (``invalid`` on a bad payload, nothing queued): ids inside the
vocabulary, at most ``max_model_len - 1`` tokens per event, sampling values as ``SamplingParams``
and the engine's validation would check them. Whether the context still fits is checked again at
the boundary, because generated tokens grow the context after submission.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, replace
from typing import Any

from execstate.engine.grammar.spec import StructuredOutputsParams
from execstate.engine.sampling_params import SamplingParams
from execstate.engine.tokenizer import Tokenizer
from execstate.engine.validation import validate_logit_bias, validate_sampling, validate_structured_outputs
from execstate.session.runtime.events import COMPOSITE, EventKind, Merge

INPUT = "input"
SAMPLING = "sampling"
SAMPLING_FIELDS = frozenset({
    "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
    "logit_bias", "max_tokens", "min_tokens", "stop", "stop_token_ids", "ignore_eos", "logprobs",
    "skip_special_tokens", "structured_outputs",
})
assert {f.name for f in fields(SamplingParams)} >= SAMPLING_FIELDS


def lm_event_kinds(vocab_size: int, max_model_len: int, tokenizer: Tokenizer | None) -> dict[str, EventKind]:
    """The kinds an LM session accepts, with validators bound to the model."""

    def input_tokens(data: Any) -> tuple[int, ...]:
        if not isinstance(data, Mapping) or set(data) - {"token_ids", "text", "add_special_tokens"}:
            raise ValueError("data must be {'token_ids': [...]} or {'text': '...'}")
        if ("token_ids" in data) == ("text" in data):
            raise ValueError("data needs exactly one of 'token_ids' and 'text'")
        if "text" in data:
            ids = _encode(tokenizer, data["text"], data.get("add_special_tokens", False))
        else:
            ids = data["token_ids"]
            if not isinstance(ids, list | tuple):
                raise ValueError(f"token_ids must be a list of ints, got {type(ids).__name__}")
        if len(ids) > max_model_len - 1:
            raise ValueError(f"{len(ids)} tokens, but max_model_len is {max_model_len}")
        bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]!r} is outside the vocabulary [0, {vocab_size})")
        return tuple(ids)

    def sampling_fields(data: Any) -> dict[str, Any]:
        if not isinstance(data, Mapping) or not data:
            raise ValueError("data must be a non-empty {field: value} object")
        unknown = sorted(set(data) - SAMPLING_FIELDS)
        if unknown:
            raise ValueError(f"unknown or fixed sampling field(s) {unknown}; allowed: {sorted(SAMPLING_FIELDS)}")
        data = {**data, "structured_outputs": _constraint(data["structured_outputs"])} \
            if "structured_outputs" in data else data
        probe = replace(SamplingParams(), **dict(data))  # SamplingParams validates (and normalises) each value
        validate_sampling(probe, vocab_size)
        validate_logit_bias(probe.logit_bias, vocab_size)
        return {k: getattr(probe, k) for k in data}

    return {INPUT: EventKind(INPUT, Merge.APPEND, input_tokens),
            SAMPLING: EventKind(SAMPLING, Merge.REPLACE, sampling_fields)}


def _constraint(value: Any) -> StructuredOutputsParams | None:
    if value is None or isinstance(value, StructuredOutputsParams):
        spec = value
    elif isinstance(value, Mapping):
        spec = StructuredOutputsParams.from_dict(dict(value))
    else:
        raise ValueError("structured_outputs must be an object such as {'regex': '...'} or null")
    if spec is not None:
        validate_structured_outputs(spec)
    return spec


def pretokenize(kind: str, data: Any, tokenizer: Tokenizer | None) -> Any:
    """``data`` with every text input replaced by its token ids (``{"token_ids": [...]}``), so a
    front can tokenise off the engine thread; anything it cannot read is returned unchanged
    for the validator to refuse."""
    if kind == INPUT and isinstance(data, Mapping) and isinstance(data.get("text"), str) and "token_ids" not in data:
        extra = set(data) - {"text", "add_special_tokens"}
        if extra or not isinstance(data.get("add_special_tokens", False), bool):
            return data
        try:
            return {"token_ids": _encode(tokenizer, data["text"], data.get("add_special_tokens", False))}
        except ValueError:
            return data  # the validator refuses it with the same message
    if kind == COMPOSITE and isinstance(data, Mapping) and isinstance(data.get("events"), list):
        parts = [
            {**p, "data": pretokenize(p["kind"], p.get("data"), tokenizer)}
            if isinstance(p, Mapping) and isinstance(p.get("kind"), str) else p
            for p in data["events"]
        ]
        return {**data, "events": parts}
    return data


def _encode(tokenizer: Tokenizer | None, text: Any, add_special_tokens: Any) -> list[int]:
    if tokenizer is None:
        raise ValueError("this model has no tokenizer: send {'token_ids': [...]}")
    if not isinstance(text, str) or not text:
        raise ValueError("text must be a non-empty string")
    if not isinstance(add_special_tokens, bool):
        raise ValueError("add_special_tokens must be true or false")
    return tokenizer.encode(text, add_special_tokens=add_special_tokens)

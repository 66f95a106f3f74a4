"""A session step as the engine takes it (``LLMEngine.add_step_request``; sessions: ``session/``).

The step's input (:class:`StepRequest`) and what its hook gets at the end (:class:`FinishedStep`)
are public (``engine/session_step.py``, re-exported here); this module builds the engine request.

``build_step_request`` (called by ``RequestIntake.build_step`` with the engine's limits, live request
ids and block holds) validates everything first (``ValueError``, nothing changed) and builds the
engine ``Request`` with ``session.keep_blocks`` set; the engine then hands the held blocks over (they
become the request's references) and queues it. The trace and the generator stay shared with the
session: the request fills the trace and draws from the generator in place. The ids in
``token_ids`` are not scanned again: the session validated each input event when it was submitted.
The step's ``on_finished`` is wrapped: at finish it gets the request's :class:`FinishedStep`
(:func:`finished_step`), the returned blocks taken out of the request and handed to it.
"""

from __future__ import annotations

from collections.abc import Callable, Container

from execstate.engine.outputs import RequestOutput
from execstate.engine.penalties import PenaltyState
from execstate.engine.request import Request, RequestStatus, SessionLink
from execstate.engine.sampling_state import SamplingState
from execstate.engine.session_step import FinishedStep, StepRequest
from execstate.engine.validation import check_prompt_length, validate_logit_bias, validate_sampling
from execstate.state.block_holds import BlockHolds

__all__ = ["FinishedStep", "StepRequest", "build_step_request", "finished_step"]


def build_step_request(step: StepRequest, *, vocab_size: int, max_model_len: int, in_use: Container[str],
                       kv_holds: BlockHolds, return_routes: bool, with_text: bool) -> Request:
    """The engine ``Request`` for ``step`` (module docstring); ValueError on bad input. ``in_use``:
    the ids of live requests; ``kv_holds``: where the step's held blocks must be registered;
    ``return_routes``: whether the engine returns routes; ``with_text``: whether it detokenizes
    (it has a tokenizer)."""
    if step.request_id in in_use:
        raise ValueError(f"request id {step.request_id!r} is already in use")
    if step.params.n != 1:
        raise ValueError("a session step takes n=1")
    validate_sampling(step.params, vocab_size)
    validate_logit_bias(step.params.logit_bias, vocab_size)
    if not step.token_ids:
        raise ValueError("a step needs at least one token of context")
    check_prompt_length(len(step.token_ids), max_model_len)
    held = step.held
    if held is not None:
        if not kv_holds.holds(held):
            raise ValueError("the step's blocks are not held (released, or handed over already)")
        if not 0 < held.num_tokens < len(step.token_ids):
            raise ValueError(f"held KV of {held.num_tokens} tokens for a step of {len(step.token_ids)} tokens")
        if step.routes is not None and step.routes.rows_known < held.num_tokens:
            raise ValueError(f"route rows for {step.routes.rows_known} of the {held.num_tokens} held tokens")
    if (step.routes is not None) != return_routes:
        raise ValueError("a step carries a route trace exactly when the engine returns routes")
    if (step.grammar is not None) != (step.params.structured_outputs is not None):
        raise ValueError("a step carries a grammar matcher exactly when its sampling params constrain the output")
    req = Request(step.request_id, step.token_ids, step.params, max_model_len, priority=step.priority, scope=step.scope)
    hook = step.on_finished
    req.session = SessionLink(keep_blocks=True, on_finished=None if hook is None else _handing(hook, with_text))
    req.routes = step.routes
    req.grammar = step.grammar
    req.sampling = SamplingState(step.generator, PenaltyState.for_request(step.params, req.prompt_token_ids,
                                                                          req.output_token_ids, vocab_size))
    return req


def _handing(hook: Callable[[FinishedStep], None], with_text: bool) -> Callable[[Request, RequestOutput], None]:
    return lambda req, out: hook(finished_step(req, out, with_text))


def finished_step(req: Request, out: RequestOutput, with_text: bool) -> FinishedStep:
    """What the finished step ``req`` (final output ``out``) hands its session; its returned blocks
    are taken out of the request (the session's now)."""
    blocks, req.session.returned_blocks = req.session.returned_blocks, None
    wants_logprobs = req.params.logprobs is not None
    return FinishedStep(
        request_id=req.request_id, blocks=blocks, aborted=req.status is RequestStatus.FINISHED_ABORTED,
        error=req.abort_message, token_ids=req.all_token_ids, output_token_ids=list(req.output_token_ids),
        num_prompt_tokens=req.num_prompt_tokens, num_cached_tokens=req.num_cached_tokens,
        finish_reason=req.finish_reason, stop_reason=req.stop_reason,
        text=req.output.detok.text(True) if with_text else None,
        logprobs=list(req.output.logprob_entries) if wants_logprobs else None,
        cumulative_logprob=req.output.cumulative_logprob if wants_logprobs else None,
        routed_experts=out.outputs[0].routed_experts, hidden=req.output.hidden)

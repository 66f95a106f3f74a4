"""A session step as the engine takes it (``LLMEngine.add_step_request``; sessions: ``session/``).

A :class:`StepRequest` is the session's whole context plus the step's input (``token_ids``), the
blocks holding the KV of its first ``held.num_tokens`` tokens (registered in the engine's block
holds; None: nothing held, the prefix cache is looked up as for any request), the session's route
trace (rows for at least the held tokens; present exactly when the engine returns routes) and
its generator, the scheduling class, a hook for the end, and the session's grammar matcher when
its sampling parameters constrain the output (``structured_outputs``; advanced in place, like the
generator: the session owns it).

``build_step_request`` (called by ``RequestIntake.build_step`` with the engine's limits, live request
ids and block holds) validates everything first (``ValueError``, nothing changed) and builds the
engine ``Request`` with ``session.keep_blocks`` set; the engine then hands the held blocks over (they
become the request's references) and queues it. The trace and the generator stay shared with the
session: the request fills the trace and draws from the generator in place. The ids in
``token_ids`` are not scanned again: the session validated each input event when it was submitted.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from execstate.engine.penalties import PenaltyState
from execstate.engine.priority import PRIORITY_INTERACTIVE
from execstate.engine.request import Request, SessionLink
from execstate.engine.route_trace import RouteTrace
from execstate.engine.sampling_params import SamplingParams
from execstate.engine.sampling_state import SamplingState
from execstate.engine.validation import check_prompt_length, validate_logit_bias, validate_sampling
from execstate.identity.scope import LOCAL_SCOPE, CacheScope
from execstate.state.block_holds import BlockHolds, HeldBlocks

if TYPE_CHECKING:
    from execstate.engine.grammar.matcher import GrammarMatcher
    from execstate.engine.outputs import RequestOutput


@dataclass(eq=False)
class StepRequest:
    request_id: str
    token_ids: list[int]
    params: SamplingParams
    held: HeldBlocks | None
    routes: RouteTrace | None
    generator: torch.Generator
    priority: int = PRIORITY_INTERACTIVE
    scope: CacheScope = LOCAL_SCOPE
    on_finished: Callable[[Request, RequestOutput], None] | None = None
    grammar: GrammarMatcher | None = None


def build_step_request(step: StepRequest, *, vocab_size: int, max_model_len: int, in_use: Container[str],
                       kv_holds: BlockHolds, return_routes: bool) -> Request:
    """The engine ``Request`` for ``step`` (module docstring); ValueError on bad input. ``in_use``:
    the ids of live requests; ``kv_holds``: where the step's held blocks must be registered;
    ``return_routes``: whether the engine returns routes."""
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
    req.session = SessionLink(keep_blocks=True, on_finished=step.on_finished)
    req.routes = step.routes
    req.grammar = step.grammar
    req.sampling = SamplingState(step.generator, PenaltyState.for_request(step.params, req.prompt_token_ids,
                                                                          req.output_token_ids, vocab_size))
    return req

"""One step of an LM session: from a step boundary to an engine request, and back.

``start_lm_step`` runs inside ``SessionRuntime.begin_step`` (so a refusal leaves the events
pending and nothing changed): it appends the boundary's ``input`` tokens to the context, applies
its ``sampling`` event, and queues an engine step (``SessionPort.add_step``) whose prompt
is the whole context, which arrives holding the session's blocks (the KV of every token but the
last generated one) and the session's route trace and generator. So step k+1 runs only the last
generated token of step k plus its new input through the model; its tokens and routes are those
of a one-shot generate over the same history.

When the request finishes, the engine thread calls the hook (``finish_lm_step``, with the step's
``FinishedStep``: ``engine/session_step.py``) before the final output is returned: the blocks come
back to the session, the context becomes the request's tokens,
and the handle gets its :class:`StepResult` (or its error). Outcomes:

- finished (stop, length): OPEN, ``step_index + 1``;
- cancelled (aborted without an error: ``cancel``, a consumer gone): OPEN, ``step_index + 1``,
  ``finish_reason == "abort"``; the context keeps the tokens generated until then;
- failed (aborted with an error: a failed engine step, a weight update): FAILED; the returned
  blocks are released; the handle's error has code ``failed``;
- the session was closed meanwhile: the returned blocks are released; error ``closed``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from execstate.engine.grammar.matcher import GrammarMatcher
from execstate.engine.outputs import Logprob
from execstate.engine.sampling_params import RequestOutputKind, SamplingParams
from execstate.engine.session_port import SessionPort
from execstate.engine.session_step import FinishedStep, StepRequest
from execstate.session.lm.events import INPUT, SAMPLING
from execstate.session.lm.state import LMState
from execstate.session.runtime.events import Drained, SessionEventError
from execstate.session.runtime.lifecycle import SessionRuntime

_request_ids = itertools.count()


@dataclass(frozen=True)
class StepResult:
    """What one completed step produced.

    ``events``: event ids of this boundary: ``started`` (applied), ``active`` (still in effect
    after the step; none for LM events) and ``completed`` (applied or overwritten).
    ``num_cached_tokens``: context tokens whose KV the step found (held by the session or hit in
    the prefix cache); ``num_computed_tokens``: context tokens it ran through the model (for a
    step after a completed one: its new input tokens + 1, the last generated token). Generated
    tokens are not counted in either. ``routed_experts``: the rows this step added to
    ``Session.routed_experts`` (int16 ``[n, n_moe_layers, top_k]``, None without route return
    or when cancelled).
    """

    session_id: str
    step_index: int
    token_ids: list[int]
    text: str | None
    finish_reason: str | None
    stop_reason: int | str | None
    events: dict[str, list[int]]
    num_computed_tokens: int
    num_cached_tokens: int
    routed_experts: np.ndarray | None = None
    # Per generated token, when the session's sampling params ask for logprobs (vLLM's layout).
    logprobs: list[dict[int, Logprob]] | None = None
    cumulative_logprob: float | None = None
    # The final hidden state where the step sampled its first token, when the session's sampling
    # params ask for it (``return_hidden``; float32 ``[hidden_size]``).
    hidden: np.ndarray | None = None


@dataclass(frozen=True)
class StepDelta:
    """What a streamed step produced since its previous delta."""

    session_id: str
    step_index: int
    token_ids: list[int]
    text: str


@dataclass(eq=False)
class StepHandle:
    """A step in flight (engine thread). ``done`` once its request finished; then ``result`` or
    ``error`` is set."""

    session_id: str
    step_index: int
    request_id: str
    events: dict[str, list[int]]
    done: bool = False
    result: StepResult | None = None
    error: SessionEventError | None = None
    on_done: list[Callable[[StepHandle], object]] = field(default_factory=list)  # results unused


def start_lm_step(
    port: SessionPort, rt: SessionRuntime, drained: Drained, max_tokens: int | None, stream: bool,
    clock: Callable[[], int],
) -> StepHandle:
    """Start the step of ``rt`` at this boundary (module docstring); SessionEventError ``invalid``
    (nothing changed) when it cannot run."""
    state = rt.state
    assert isinstance(state, LMState)
    new_tokens = [t for e in drained.applied if e.kind == INPUT for t in e.data]
    params = state.params
    for e in drained.applied:
        if e.kind == SAMPLING:
            params = replace(params, **e.data)
    tokens = state.token_ids + new_tokens
    if not tokens:
        raise SessionEventError("invalid", "the context is empty: the first step needs input")
    if len(tokens) >= port.max_model_len:
        raise SessionEventError("invalid", f"the context would hold {len(tokens)} tokens, but max_model_len is "
                                f"{port.max_model_len}; roll back or close the session")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise SessionEventError("invalid", f"max_tokens must be an integer >= 1, got {max_tokens!r}")
    kind = RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY
    step_params = replace(params, n=1, seed=state.seed, output_kind=kind, routed_experts=None,
                          max_tokens=max_tokens if max_tokens is not None else params.max_tokens,
                          routed_experts_prompt_start=max(len(state.token_ids) - 1, 0))
    grammar = _step_grammar(port, state.grammar, params)
    started: list[int] = sorted({e.event_id for e in drained.applied})
    completed: list[int] = list(drained.event_ids)  # a fresh list either way
    handle = StepHandle(rt.session_id, rt.step_index + 1, f"session:{rt.session_id}:{next(_request_ids)}",
                        {"started": started, "active": [], "completed": completed})

    def hook(done: FinishedStep) -> None:
        finish_lm_step(port, rt, handle, done, clock)

    try:
        port.add_step(StepRequest(
            handle.request_id, tokens, step_params, held=state.blocks, routes=state.routes, generator=state.generator,
            priority=state.priority, scope=state.identity.scope, on_finished=hook, grammar=grammar))
    except ValueError as exc:
        raise SessionEventError("invalid", str(exc)) from None
    state.blocks = None  # the request holds them until it finishes
    state.params = params
    state.grammar = grammar  # the request advances it in place
    return handle


def _step_grammar(port: SessionPort, current: GrammarMatcher | None, params: SamplingParams) -> GrammarMatcher | None:
    """The matcher a step constrains its output with: the session's own when the constraint is
    unchanged and not complete yet (a constrained output over several steps), else a fresh one;
    None without a constraint. SessionEventError ``invalid`` (nothing changed) if it cannot compile."""
    spec = params.structured_outputs
    if spec is None:
        return None
    if current is not None and current.spec.key == spec.key and not current.stopped:
        return current
    if port.grammar is None:
        raise SessionEventError("invalid", "structured outputs need the model's tokenizer")
    try:
        return port.grammar.compile(spec).matcher()
    except ValueError as exc:
        raise SessionEventError("invalid", str(exc)) from None


def finish_lm_step(port: SessionPort, rt: SessionRuntime, handle: StepHandle, done: FinishedStep,
                   clock: Callable[[], int]) -> None:
    """The hook: take the step's blocks back and settle the outcome (module docstring)."""
    state = rt.state
    assert isinstance(state, LMState)
    returned = done.blocks
    try:
        if state.released or done.failed:
            if returned is not None:
                port.release(returned)
            if state.released:
                handle.error = SessionEventError("closed", f"session {rt.session_id!r} ended during its step")
            else:
                rt.end_step(False, done.error, clock())
                handle.error = SessionEventError("failed", f"step {handle.step_index} of session "
                                                 f"{rt.session_id!r} failed: {done.error}")
            return
        state.blocks = returned
        state.token_ids = done.token_ids
        rt.end_step(True, clock=clock())
        admitted = done.num_cached_tokens is not None  # a step cancelled while queued computed nothing
        num_cached = done.num_cached_tokens or 0
        handle.result = StepResult(
            session_id=rt.session_id, step_index=rt.step_index, token_ids=done.output_token_ids, text=done.text,
            finish_reason=done.finish_reason, stop_reason=done.stop_reason, events=handle.events,
            num_computed_tokens=done.num_prompt_tokens - num_cached if admitted else 0, num_cached_tokens=num_cached,
            routed_experts=None if done.aborted else done.routed_experts,
            logprobs=done.logprobs, cumulative_logprob=done.cumulative_logprob,
            hidden=None if done.aborted else done.hidden,
        )
    finally:
        handle.done = True
        for fn in handle.on_done:
            fn(handle)

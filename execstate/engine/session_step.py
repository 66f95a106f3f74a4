"""A session step as the engine takes it, and what it hands back: the input and the result of
``SessionPort.add_step`` (``engine/session_port.py``; sessions: ``session/``).

A :class:`StepRequest` is the session's whole context plus the step's input (``token_ids``), the
blocks holding the KV of its first ``held.num_tokens`` tokens (registered in the engine's block
holds; None: nothing held, the prefix cache is looked up as for any request), the session's route
trace (rows for at least the held tokens; present exactly when the engine returns routes) and
its generator, the scheduling class, a hook for the end, and the session's grammar matcher when
its sampling parameters constrain the output (``structured_outputs``; advanced in place, like the
generator: the session owns it). The trace and the generator stay shared with the session: the
step fills the trace and draws from the generator in place.

A :class:`FinishedStep` is what the hook (``on_finished``) gets, once, on the engine thread, as
the step's request finishes and before its final output is returned: how it ended, its tokens,
counters, text, logprobs and routes, and the step's computed blocks (``blocks``, held in the
engine's block holds), which are the hook's from then on: it keeps them for the next step or
releases them (``SessionPort.release``). A hook that raises is logged by the engine; the blocks
it was handed stay the hook's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from execstate.engine.grammar.matcher import GrammarMatcher
from execstate.engine.outputs import Logprob
from execstate.engine.priority import PRIORITY_INTERACTIVE
from execstate.engine.route_trace import RouteTrace
from execstate.engine.sampling_params import SamplingParams
from execstate.identity.scope import LOCAL_SCOPE, CacheScope
from execstate.state.block_holds import HeldBlocks

__all__ = ["FinishedStep", "StepRequest"]


@dataclass(frozen=True)
class FinishedStep:
    """How a session step ended (module docstring).

    ``aborted``: aborted (a cancel, a consumer gone: ``error`` None; a failed engine step, a weight
    update: ``error`` says why); ``token_ids``: the context after the step (prompt then generated
    tokens; the step's request is done with the list); ``output_token_ids``: the generated ones;
    ``num_cached_tokens``: prompt tokens whose KV it found (held or a prefix-cache hit; None: it
    was never admitted, so computed nothing); ``text``: the generated text (None without a
    tokenizer); ``logprobs`` / ``cumulative_logprob``: None unless its sampling params ask for
    logprobs; ``routed_experts``: its final output's routes (None without route return);
    ``hidden``: the final hidden state where the step sampled its first token (None unless its
    sampling params ask for it: ``return_hidden``, or it sampled none).
    """

    request_id: str
    blocks: HeldBlocks | None
    aborted: bool
    error: str | None
    token_ids: list[int]
    output_token_ids: list[int]
    num_prompt_tokens: int
    num_cached_tokens: int | None
    finish_reason: str | None
    stop_reason: int | str | None
    text: str | None
    logprobs: list[dict[int, Logprob]] | None
    cumulative_logprob: float | None
    routed_experts: np.ndarray | None
    hidden: np.ndarray | None = None

    @property
    def failed(self) -> bool:
        """Aborted with an error: its state is not to be trusted."""
        return self.aborted and self.error is not None


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
    on_finished: Callable[[FinishedStep], None] | None = None
    grammar: GrammarMatcher | None = None

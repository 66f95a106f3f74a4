"""The one place a request ends: its final output, its finish hook, and outputs held for the next step.

Contract (``LLMEngine`` builds one :class:`RequestFinisher` and hands it to the parts that end
requests: the step, aborts, the weight updater, the step-failure handler):

- Call ``finalize(req)`` once per request, after the scheduler has finished it
  (``Scheduler.finish`` / ``abort``: blocks and route leases released). It removes the
  request from the engine's live requests, builds its final ``RequestOutput`` and runs its
  finish hook; the output goes to whoever asked (the step's caller, ``abort_request``'s).
- ``run_finish_hook(req, out)``: ``req.session.on_finished`` (a session taking its step's blocks back),
  at most once (the hook is cleared before it runs). If the hook raises, the blocks it did not
  take are released so that nothing leaks; the error is logged, never raised.
- ``forget(req)``: remove the request from the live requests without an output (the
  step-failure handler, when building the output is what failed; it then runs the hook itself).
- ``defer(out)`` / ``take_deferred()``: final outputs produced between steps (an abort whose
  caller is not the request's consumer, a step aborted by a weight switch) wait here and are
  returned, in order, by the next ``step()``.

Threads: the engine thread only.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from execstate.engine.output_builder import build_output
from execstate.engine.outputs import RequestOutput
from execstate.engine.r3_clock import R3Clock
from execstate.engine.request import Request
from execstate.engine.tokenizer import Tokenizer
from execstate.state.block_holds import BlockHolds

if TYPE_CHECKING:
    from collections.abc import MutableMapping

logger = logging.getLogger(__name__)


class RequestFinisher:
    """Ends requests (module docstring). ``requests``: the engine's live requests by id (shared,
    not copied); ``kv_holds``: where a failed hook's blocks are released."""

    def __init__(self, requests: MutableMapping[str, Request], tokenizer: Tokenizer | None, return_routes: bool,
                 r3_clock: R3Clock, kv_holds: BlockHolds) -> None:
        self._requests = requests
        self._tokenizer = tokenizer
        self._return_routes = return_routes
        self._r3_clock = r3_clock
        self._kv_holds = kv_holds
        self._deferred: list[RequestOutput] = []

    def finalize(self, req: Request) -> RequestOutput:
        """The final output of ``req`` (finished by the scheduler already); runs its finish hook."""
        self.forget(req)
        t_r3 = time.perf_counter()
        out = build_output(req, self._tokenizer, self._return_routes)
        if out.outputs[0].routed_experts is not None:
            self._r3_clock.add_since(t_r3)  # the output is built anyway; dominated by the routes array
        self.run_finish_hook(req, out)
        return out

    def forget(self, req: Request) -> None:
        """Drop ``req`` from the live requests (no output, no hook)."""
        self._requests.pop(req.request_id, None)

    def run_finish_hook(self, req: Request, out: RequestOutput) -> None:
        """``req.session.on_finished``, once; a hook that raises is logged and its blocks released."""
        hook, req.session.on_finished = req.session.on_finished, None
        if hook is None:
            return
        try:
            hook(req, out)
        except Exception:  # noqa: BLE001 - a hook must not take the engine down
            logger.exception("the finish hook of request %s failed", req.request_id)
            held = req.session.returned_blocks
            if held is not None and self._kv_holds.holds(held):
                self._kv_holds.release(held)

    def defer(self, out: RequestOutput) -> None:
        """Hold a final output for the next ``step()``."""
        self._deferred.append(out)

    def take_deferred(self) -> list[RequestOutput]:
        """The held outputs, oldest first; none are held afterwards."""
        out, self._deferred = self._deferred, []
        return out

    @property
    def has_deferred(self) -> bool:
        return bool(self._deferred)

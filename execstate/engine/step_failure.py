"""What happens when a step raises: its requests fail, the engine goes on (docs/contracts.md 8).

Contract (``LLMEngine.step`` calls :meth:`StepFailure.fail` from its ``except``):

- The *requests of the step* are those the scheduler returned for it; if the step
  raised before the scheduler returned, every unfinished request (the step's set is
  unknown). Requests not in the step are left alone and continue.
- Each of them that has not finished yet is finished with ``finish_reason == "abort"``
  and ``error`` saying the step failed (and why), which releases its blocks and route
  leases through the scheduler (exactly once, as any finish). Outputs the step had
  already produced are kept and returned first, so consumers see them in order.
- Then the shared state is checked (``verify``, given by the engine): the block pool and the
  route store must pass ``check_integrity()``, and every block reference must belong to a live
  request or to a hold of a session or checkpoint (:func:`check_references`; skipped while PD
  holds blocks outside requests: exports awaiting pickup, loads in flight, fenced blocks). A
  failed session step hands its blocks back to its session like any finished step, so they are
  counted there. If the check fails, or if failing the requests raised in turn, shared state may
  be corrupt and ``EngineCorruptedError`` is raised: the engine must stop (the server exits so
  that a supervisor restarts it). A step whose error is not attributable to any request
  (nothing was scheduled) re-raises as ``EngineFatalError`` for the same reason: the error
  would repeat on every step.
- ``EngineFatalError`` raised inside the step (a broken engine invariant) propagates
  unchanged.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from execstate.engine.finisher import RequestFinisher
from execstate.engine.outputs import CompletionOutput, RequestOutput
from execstate.engine.request import Request, RequestStatus
from execstate.state.block_holds import BlockHolds
from execstate.state.block_pool import BlockId, BlockPool

if TYPE_CHECKING:
    from execstate.engine.scheduler import Scheduler, SchedulerOutput

logger = logging.getLogger(__name__)


class EngineFatalError(RuntimeError):
    """The engine cannot go on serving (a broken invariant, possibly corrupt shared state)."""


class EngineCorruptedError(EngineFatalError):
    """A step failed and the shared state (block pool, route store) fails its integrity check."""


@dataclass
class StepState:
    """What one step has done so far; read only when the step raised."""

    sched: SchedulerOutput | None = None
    outputs: list[RequestOutput] = field(default_factory=list)


class StepFailure:
    """Fails the requests of a step that raised (module docstring). ``requests``: the engine's
    live requests (read); ``verify``: raises when shared state is inconsistent."""

    def __init__(self, scheduler: Scheduler, requests: Mapping[str, Request], finisher: RequestFinisher,
                 verify: Callable[[], None]) -> None:
        self._scheduler = scheduler
        self._requests = requests
        self._finisher = finisher
        self._verify = verify

    def fail(self, state: StepState, exc: Exception) -> list[RequestOutput]:
        """Fail the requests of the step that raised ``exc``; return every output to deliver."""
        if isinstance(exc, EngineFatalError):
            raise exc
        if state.sched is not None:
            victims = [s.request for s in state.sched.scheduled]
        else:
            victims = list(self._requests.values())
        if not victims:
            raise EngineFatalError(f"an engine step failed outside any request: {exc!r}") from exc
        logger.error("an engine step failed; failing its %d request(s)", len(victims), exc_info=exc)
        message = f"the engine step serving this request failed: {exc!r}"
        delivered = {o.request_id for o in state.outputs if o.finished}
        outputs = list(state.outputs)
        try:
            for req in victims:
                if req.request_id in delivered:
                    continue
                if not req.is_finished:
                    req.abort_message = message
                    self._scheduler.finish(req, RequestStatus.FINISHED_ABORTED)
                outputs.append(self._final_output(req))
            self._verify()
        except Exception as corrupt:
            raise EngineCorruptedError(
                f"an engine step failed ({exc!r}) and shared state is inconsistent afterwards: {corrupt!r}"
            ) from exc
        return outputs

    def _final_output(self, req: Request) -> RequestOutput:
        """The request's final output; a bare one if building it fails (it may be what raised)."""
        try:
            return self._finisher.finalize(req)
        except Exception:  # noqa: BLE001 - the request must still get its terminal output
            self._finisher.forget(req)
            bare = _bare_output(req)
            self._finisher.run_finish_hook(req, bare)
            return bare


class BlockOwners(Protocol):
    """What :func:`check_references` reads (``LLMEngine`` is one)."""

    @property
    def requests(self) -> Mapping[str, Request]: ...

    @property
    def kv_holds(self) -> BlockHolds: ...

    @property
    def block_pool(self) -> BlockPool: ...

    def blocks_held_elsewhere(self) -> bool: ...


def check_references(owners: BlockOwners) -> None:
    """Raise ``AssertionError`` unless each block's reference count is the number of live
    requests holding it plus the number of session/checkpoint holds on it (a leaked or lost
    reference). No-op while PD holds blocks outside requests."""
    if owners.blocks_held_elsewhere():
        return
    by_requests = Counter(b for req in owners.requests.values() for b in req.block_ids)
    by_holds = owners.kv_holds.counts()
    pool = owners.block_pool
    wrong = [b for b in map(BlockId, range(pool.num_blocks))
             if pool.ref_count(b) != by_requests.get(b, 0) + by_holds.get(b, 0)]
    if wrong:
        b = wrong[0]
        raise AssertionError(
            f"{len(wrong)} block(s) with references no request or hold accounts for, e.g. block {b}: "
            f"ref_count {pool.ref_count(b)}, held by {by_requests.get(b, 0)} request(s) and "
            f"{by_holds.get(b, 0)} session/checkpoint hold(s)"
        )


def _bare_output(req: Request) -> RequestOutput:
    completion = CompletionOutput(
        index=0, text="", token_ids=list(req.output_token_ids), cumulative_logprob=None, logprobs=None,
        finish_reason=req.finish_reason,
    )
    return RequestOutput(
        request_id=req.request_id, prompt=req.prompt, prompt_token_ids=list(req.prompt_token_ids),
        outputs=[completion], finished=True, error=req.abort_message or "the request failed",
    )

"""Asyncio front of the single-threaded engine: one thread owns ``LLMEngine``.

Contract:

- Exactly one background thread (``execstate-engine``) touches the wrapped engine. Every
  other thread talks to it through a FIFO command queue (add, abort, run a function),
  drained between steps. The thread loops ``step()`` while requests are unfinished and
  blocks on the queue when idle (no busy-wait); while loads or exports are pending
  (``needs_polling``) it wakes every 50 ms to ``poll``. A step in which every request
  waits for a KV load blocks until a load finishes or a command arrives (``LLMEngine.wake``).
- ``generate`` yields the ``RequestOutput``s of one request as they are produced
  (delivered with ``loop.call_soon_threadsafe`` into a per-request asyncio queue); what
  each carries follows ``params.output_kind`` (everything so far, deltas, or only the
  final one); the last one has ``finished=True``. A ``ValueError`` from ``add_request`` is raised in the
  caller and leaves the engine untouched. If the consumer stops early (cancelled, the
  generator closed, a client disconnect), the request is aborted and its blocks freed.
- ``abort`` finishes a request from outside; its consumer receives the final output with
  ``finish_reason == "abort"``.
- ``stream(start)`` is ``generate`` for a request some other layer adds: ``start(engine)`` runs
  on the engine thread, adds exactly one request (e.g. a session step) and returns its id; its
  outputs are yielded as ``generate`` yields them (no admission ticket: the caller bounds its
  own requests, as sessions do). Closing the iterator early aborts that request.
- ``add_shutdown_hook(fn)``: ``fn(engine)`` runs on the engine thread at ``shutdown``, after
  the requests in flight were aborted (sessions release their state there).
- ``update_weights`` is a command too: a checkpoint path is read off the engine thread,
  validation and the switch run on it. Under ``drain`` the thread keeps stepping (and
  streaming) the requests in flight and accepts new ones, which wait; the awaitable
  completes once the weights are switched. Under ``abort`` the consumers of the requests
  in flight receive their final ``"abort"`` output.
- Admission (``admission.py``): with ``max_waiting_requests``, ``generate`` counts its
  request against the bounded waiting queue before anything reaches the engine thread
  and raises ``EngineOverloadedError`` when it is full. A caller with several requests
  reserves them together with ``admit(k)`` and passes the ticket to each ``generate``,
  then ``release``s it.
- A step that raises fails only the requests of that step (``LLMEngine.step``); they
  receive a final output with ``finish_reason == "abort"`` and ``error`` set.
- If the engine thread crashes (or a failed step leaves shared state corrupt), every
  pending request and command gets an ``EngineDeadError`` (with the crash as
  ``__cause__``), ``is_healthy`` turns False and later calls raise ``EngineDeadError``
  at once; ``wait_dead`` returns. ``shutdown`` does the same with a "shut down"
  message and joins the thread.
- The thread itself (the loop, the commands, delivery, dying) is ``engine/engine_thread.py``.
- What the layers above read of the engine, and the few things they do to it, are named methods
  (``summary``, ``load``, ``weights_version``, ``home``, ``peer``, ``close_kv_events``): each
  runs on the engine thread between steps and returns a frozen value
  (``engine/engine_facts.py``). A layer that keeps its own state on the engine thread (sessions)
  holds it in an ``EngineOwned`` (``engine/engine_owned.py``), built by ``own``.
  ``run_on_engine`` / ``call`` (any function of the engine) are for the engine package and tests.
- Immutable facts about the model (``tokenizer``, ``model_config``, ``max_model_len``,
  ``return_routes``, ``handoff_trust``) are read once at construction and may be used from any thread;
  the tokenizer is never mutated after loading.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch

from execstate.engine.admission import Admission, AdmissionControl, EngineOverloadedError
from execstate.engine.config import EngineConfig
from execstate.engine.engine_commands import (
    AbortCommand,
    AddCommand,
    AddWithCommand,
    CallCommand,
    EngineDeadError,
    OutputSink,
    StopCommand,
    UpdateWeightsCommand,
    copy_dead_error,
)
from execstate.engine.engine_facts import (
    EngineHome,
    EngineLoad,
    EngineSummary,
    PeerCredentials,
    home_of,
    load_of,
    peer_of,
    summary_of,
    weights_version_of,
)
from execstate.engine.engine_owned import EngineOwned
from execstate.engine.engine_thread import EngineThread
from execstate.engine.llm_engine import LLMEngine, PromptType
from execstate.engine.outputs import RequestOutput, ScoreOutput
from execstate.engine.sampling_params import SamplingParams
from execstate.engine.scorer import score_tokens
from execstate.engine.session_engine import SessionEngine
from execstate.engine.session_port import SessionPort
from execstate.engine.weight_update import UpdatePolicy, WeightUpdateResult
from execstate.identity.scope import CacheScope
from execstate.model.loader import load_hf_state_dict
from execstate.transfer.handoff import Handoff, HandoffTrust

if TYPE_CHECKING:
    from execstate.engine.pd_config import ImporterFactory, TransferObserver

T = TypeVar("T")
O = TypeVar("O")  # noqa: E741 - what an EngineOwned holds

__all__ = ["Admission", "AsyncEngine", "EngineDeadError", "EngineOverloadedError", "EngineOwned"]


class AsyncEngine:
    def __init__(self, engine: LLMEngine, max_waiting_requests: int | None = None) -> None:
        self._engine = engine
        self._admission = AdmissionControl(max_waiting_requests, engine.scheduler.max_num_seqs)
        self.tokenizer = engine.tokenizer
        self.model_config = engine.model_config
        self.max_model_len: int = engine.max_model_len
        self.return_routes: bool = engine.return_routes
        self.model_path = engine.model_path
        self.grammar = engine.grammar  # structured outputs: thread-safe, compile off the engine thread
        # The PD connector's trust policy (thread-safe, immutable): the HTTP layer checks incoming
        # handoffs with it before the engine sees them; None unless the connector consumes.
        self.handoff_trust: HandoffTrust | None = (engine.pd.trust if engine.pd is not None and engine.pd.is_consumer
                                                   else None)
        self._worker = EngineThread(engine, self._admission)
        self._thread = self._worker.thread
        self._worker.start()

    @classmethod
    def from_config(cls, config: EngineConfig, max_waiting_requests: int | None = None, *,
                    make_importer: ImporterFactory | None = None,
                    on_transfer: TransferObserver | None = None) -> AsyncEngine:
        """Build the ``LLMEngine`` of ``config`` (on the calling thread; with its KV connectors,
        the PD one from ``config.kv_transfer`` with ``make_importer`` / ``on_transfer``) and start
        its thread."""
        return cls(LLMEngine(config, make_importer=make_importer, on_transfer=on_transfer), max_waiting_requests)

    # -- health -------------------------------------------------------------------------------
    @property
    def is_healthy(self) -> bool:
        return self._worker.is_healthy

    @property
    def error(self) -> EngineDeadError | None:
        """Why the engine stopped serving; ``None`` while it is healthy."""
        return self._worker.error

    def wait_dead(self, timeout: float | None = None) -> bool:
        """Block until the engine thread stopped serving (crash or shutdown); False on timeout."""
        return self._worker.wait_dead(timeout)

    # -- admission ------------------------------------------------------------------------------
    def admit(self, count: int) -> Admission:
        """Reserve waiting-queue slots for ``count`` requests at once (see ``admission.py``):
        ``EngineOverloadedError`` when they do not fit now, ``ValueError`` when they never can."""
        if self._worker.error is not None:
            raise copy_dead_error(self._worker.error)
        return self._admission.admit(count)

    def release(self, admission: Admission) -> None:
        """Give back the slots of ``admission`` that no ``generate`` used."""
        self._admission.release(admission)

    # -- API ----------------------------------------------------------------------------------
    async def generate(
        self,
        prompt: PromptType,
        params: SamplingParams,
        request_id: str,
        kv_transfer_params: dict[str, Any] | Handoff | None = None,
        admission: Admission | None = None,
        scope: CacheScope | None = None,
    ) -> AsyncGenerator[RequestOutput, None]:
        """Add one request (``params.n`` must be 1) and yield its outputs until finished.
        ``scope``: the caller's tenant and salt (``LLMEngine.add_request``).

        Raises ``ValueError`` (bad input, engine untouched) or ``EngineOverloadedError``
        (waiting queue full; not with an ``admission`` that has a slot left) before
        yielding anything, and ``EngineDeadError`` if the engine dies meanwhile. Closing or
        cancelling the iterator early aborts the request.
        """
        loop = asyncio.get_running_loop()
        sink = OutputSink(loop, asyncio.Queue())
        added: concurrent.futures.Future[None] = concurrent.futures.Future()
        own = admission is None
        ticket = self.admit(1) if admission is None else admission
        try:
            self._admission.take(ticket)
            self._worker.submit(AddCommand(prompt, params, request_id, kv_transfer_params, scope, sink, added))
        finally:
            if own:
                self._admission.release(ticket)
        finished = False
        try:
            try:
                await asyncio.wrap_future(added)
            except Exception:
                finished = True  # rejected (ValueError) or never added: nothing to abort
                raise
            while True:
                item = await sink.queue.get()
                if isinstance(item, EngineDeadError):
                    finished = True  # the engine already dropped the request
                    raise copy_dead_error(item)
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if not finished:  # consumer gone early (or cancelled while adding): free the request
                self._worker.submit_nowait(AbortCommand(request_id))

    async def stream(self, start: Callable[[LLMEngine], str]) -> AsyncGenerator[RequestOutput, None]:
        """Run ``start(engine)`` on the engine thread (it adds one request and returns its id) and
        yield that request's outputs until finished, as ``generate`` does. An exception from
        ``start`` is raised here before anything is yielded (nothing was added). Closing or
        cancelling the iterator early aborts the request."""
        loop = asyncio.get_running_loop()
        sink = OutputSink(loop, asyncio.Queue())
        added: concurrent.futures.Future[str] = concurrent.futures.Future()
        self._worker.submit(AddWithCommand(start, sink, added))
        request_id: str | None = None
        finished = False
        try:
            try:
                request_id = await asyncio.wrap_future(added)
            except BaseException:
                finished = True  # nothing to abort here; if the request gets added anyway, abort it then
                added.add_done_callback(self._abort_added)
                raise
            while True:
                item = await sink.queue.get()
                if isinstance(item, EngineDeadError):
                    finished = True
                    raise copy_dead_error(item)
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if not finished and request_id is not None:
                self._worker.submit_nowait(AbortCommand(request_id))

    def _abort_added(self, added: concurrent.futures.Future[str]) -> None:
        if not added.cancelled() and added.exception() is None:
            self._worker.submit_nowait(AbortCommand(added.result()))

    def own(self, build: Callable[[LLMEngine], O], close: Callable[[O], None] | None = None) -> EngineOwned[O]:
        """State kept on the engine thread: built there by ``build(engine)`` at its first use,
        reached only through the returned :class:`EngineOwned` (``engine/engine_owned.py``);
        ``close(owned)`` runs on the engine thread at shutdown."""
        return EngineOwned(self, build, close)

    def own_sessions(self, build: Callable[[SessionEngine, SessionPort], O],
                     close: Callable[[O], None] | None = None) -> EngineOwned[O]:
        """``own`` for a session kind's sessions object: ``build(engine, port)`` gets the engine as
        a session kind reads it (``engine/session_engine.py``) and its session port
        (``engine/session_port.py``)."""
        return EngineOwned(self, lambda engine: build(engine, SessionPort(engine)), close)

    def add_shutdown_hook(self, fn: Callable[[LLMEngine], None]) -> None:
        """``fn(engine)`` runs on the engine thread at shutdown, after in-flight requests were aborted."""
        self._worker.add_shutdown_hook(fn)

    async def abort(self, request_id: str) -> None:
        """Abort a request (no-op if it is unknown or already finished)."""
        self._worker.submit(AbortCommand(request_id))

    async def run_on_engine(self, fn: Callable[[LLMEngine], T]) -> T:
        """Run ``fn(engine)`` on the engine thread between steps and return its result.

        An exception raised by ``fn`` is re-raised here and does not hurt the engine.
        """
        done: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._worker.submit(CallCommand(fn, done))
        return await asyncio.wrap_future(done)

    async def update_weights(
        self, source: str | Path | dict[str, torch.Tensor], weights_version: str | None = None,
        policy: UpdatePolicy = "abort",
    ) -> WeightUpdateResult:
        """``LLMEngine.begin_weight_update`` on the engine thread; returns once switched.

        Raises ``ValueError`` (nothing changed) or ``RuntimeError`` (an update is already
        in progress). Requests keep streaming meanwhile (see the module docstring).
        """
        state_dict = await asyncio.to_thread(load_hf_state_dict, source) if isinstance(source, str | Path) else source
        done: concurrent.futures.Future[WeightUpdateResult] = concurrent.futures.Future()
        self._worker.submit(UpdateWeightsCommand(state_dict, weights_version, policy, done))
        return await asyncio.wrap_future(done)

    def call(self, fn: Callable[[LLMEngine], T], timeout: float | None = None) -> T:
        """Blocking ``run_on_engine`` for plain threads (start-up hooks, tests).

        Called from the engine thread itself (inside ``fn``), it runs ``fn`` directly.
        """
        if self._worker.is_current():
            return fn(self._engine)
        done: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._worker.submit(CallCommand(fn, done))
        return done.result(timeout)

    # -- what the layers above read and do (engine/engine_facts.py) ------------------------------
    async def summary(self) -> EngineSummary:
        """What the engine was built with (read on the engine thread; a frozen snapshot)."""
        return await self.run_on_engine(summary_of)

    def summary_blocking(self, timeout: float | None = None) -> EngineSummary:
        """:meth:`summary` for plain threads (start-up); never on the event loop."""
        return self.call(summary_of, timeout)

    async def load(self) -> EngineLoad:
        """The engine's gauges now (read on the engine thread between steps)."""
        return await self.run_on_engine(load_of)

    async def weights_version(self) -> str:
        """The weights version new requests run on (read on the engine thread between steps)."""
        return await self.run_on_engine(weights_version_of)

    async def home(self) -> EngineHome:
        """The id naming this engine's shared state, and whether a shared tier is attached."""
        return await self.run_on_engine(home_of)

    async def peer(self) -> PeerCredentials | None:
        """The PD connector's instance id and secret ring (hand-overs); ``None`` without one."""
        return await self.run_on_engine(peer_of)

    def score_blocking(self, token_ids: list[int], routed_experts: np.ndarray | None = None,
                       timeout: float | None = None) -> ScoreOutput:
        """``LLM.score`` (teacher-forced logprobs, ``engine/scorer.py``) on the engine thread between
        steps, for plain threads; ``ValueError`` for bad tokens or routes (the engine untouched)."""
        return self.call(lambda engine: score_tokens(engine, token_ids, routed_experts), timeout)

    def close_kv_events(self, timeout: float | None = None) -> None:
        """Close the KV events feed (its sockets); blocking; a no-op without one."""
        self.call(_close_kv_events, timeout)

    def shutdown(self, timeout: float | None = 10.0) -> None:
        """Stop the engine thread; pending requests get ``EngineDeadError``. Idempotent."""
        self._worker.submit_nowait(StopCommand())
        if not self._worker.is_current():
            self._thread.join(timeout)


def _close_kv_events(engine: LLMEngine) -> None:
    if engine.kv_events is not None:
        engine.kv_events.close()

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
- Immutable facts about the model (``tokenizer``, ``model_config``, ``max_model_len``,
  ``return_routes``) are read once at construction and may be used from any thread;
  the tokenizer is never mutated after loading.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from execstate.engine.admission import Admission, AdmissionControl, EngineOverloadedError
from execstate.engine.engine_commands import (
    EngineDeadError,
    _Abort,
    _Add,
    _AddWith,
    _Call,
    _Command,
    _copy,
    _Sink,
    _Stop,
    _UpdateWeights,
)
from execstate.engine.llm_engine import LLMEngine, PromptType
from execstate.engine.outputs import RequestOutput
from execstate.engine.sampling_params import SamplingParams
from execstate.engine.weight_update import UpdatePolicy, WeightUpdate, WeightUpdateResult
from execstate.model.loader import load_hf_state_dict
from execstate.transfer.handoff import Handoff

T = TypeVar("T")

__all__ = ["Admission", "AsyncEngine", "EngineDeadError", "EngineOverloadedError"]


# How often an idle engine with pending housekeeping (PD exports) polls.
_POLL_S = 0.05

class AsyncEngine:
    def __init__(self, engine: LLMEngine, max_waiting_requests: int | None = None) -> None:
        self._engine = engine
        self._admission = AdmissionControl(max_waiting_requests, engine.scheduler.max_num_seqs)
        self.tokenizer = engine.tokenizer
        self.model_config = engine.model_config
        self.max_model_len: int = engine.max_model_len
        self.return_routes: bool = engine.return_routes
        self.model_path = engine.model_path
        self._commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._sinks: dict[str, _Sink] = {}  # engine thread only
        self._update: tuple[WeightUpdate, concurrent.futures.Future[WeightUpdateResult]] | None = None  # ditto
        self._lock = threading.Lock()  # guards _error against late submissions
        self._error: EngineDeadError | None = None
        self._dead = threading.Event()
        self._shutdown_hooks: list[Callable[[LLMEngine], None]] = []
        self._thread = threading.Thread(target=self._run, name="execstate-engine", daemon=True)
        self._thread.start()

    # -- health -------------------------------------------------------------------------------
    @property
    def is_healthy(self) -> bool:
        return self._error is None and self._thread.is_alive()

    @property
    def error(self) -> EngineDeadError | None:
        """Why the engine stopped serving; ``None`` while it is healthy."""
        return self._error

    def wait_dead(self, timeout: float | None = None) -> bool:
        """Block until the engine thread stopped serving (crash or shutdown); False on timeout."""
        return self._dead.wait(timeout)

    # -- admission ------------------------------------------------------------------------------
    def admit(self, count: int) -> Admission:
        """Reserve waiting-queue slots for ``count`` requests at once (see ``admission.py``):
        ``EngineOverloadedError`` when they do not fit now, ``ValueError`` when they never can."""
        if self._error is not None:
            raise _copy(self._error)
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
    ) -> AsyncIterator[RequestOutput]:
        """Add one request (``params.n`` must be 1) and yield its outputs until finished.

        Raises ``ValueError`` (bad input, engine untouched) or ``EngineOverloadedError``
        (waiting queue full; not with an ``admission`` that has a slot left) before
        yielding anything, and ``EngineDeadError`` if the engine dies meanwhile. Closing or
        cancelling the iterator early aborts the request.
        """
        loop = asyncio.get_running_loop()
        sink = _Sink(loop, asyncio.Queue())
        added: concurrent.futures.Future[None] = concurrent.futures.Future()
        own = admission is None
        ticket = self.admit(1) if admission is None else admission
        try:
            self._admission.take(ticket)
            self._submit(_Add(prompt, params, request_id, kv_transfer_params, sink, added))
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
                    raise _copy(item)
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if not finished:  # consumer gone early (or cancelled while adding): free the request
                self._submit_nowait(_Abort(request_id))

    async def stream(self, start: Callable[[LLMEngine], str]) -> AsyncIterator[RequestOutput]:
        """Run ``start(engine)`` on the engine thread (it adds one request and returns its id) and
        yield that request's outputs until finished, as ``generate`` does. An exception from
        ``start`` is raised here before anything is yielded (nothing was added). Closing or
        cancelling the iterator early aborts the request."""
        loop = asyncio.get_running_loop()
        sink = _Sink(loop, asyncio.Queue())
        added: concurrent.futures.Future[str] = concurrent.futures.Future()
        self._submit(_AddWith(start, sink, added))
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
                    raise _copy(item)
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if not finished and request_id is not None:
                self._submit_nowait(_Abort(request_id))

    def _abort_added(self, added: concurrent.futures.Future[str]) -> None:
        if not added.cancelled() and added.exception() is None:
            self._submit_nowait(_Abort(added.result()))

    def add_shutdown_hook(self, fn: Callable[[LLMEngine], None]) -> None:
        """``fn(engine)`` runs on the engine thread at shutdown, after in-flight requests were aborted."""
        self._shutdown_hooks.append(fn)

    async def abort(self, request_id: str) -> None:
        """Abort a request (no-op if it is unknown or already finished)."""
        self._submit(_Abort(request_id))

    async def run_on_engine(self, fn: Callable[[LLMEngine], T]) -> T:
        """Run ``fn(engine)`` on the engine thread between steps and return its result.

        An exception raised by ``fn`` is re-raised here and does not hurt the engine.
        """
        done: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._submit(_Call(fn, done))
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
        self._submit(_UpdateWeights(state_dict, weights_version, policy, done))
        return await asyncio.wrap_future(done)

    def call(self, fn: Callable[[LLMEngine], T], timeout: float | None = None) -> T:
        """Blocking ``run_on_engine`` for plain threads (start-up hooks, tests).

        Called from the engine thread itself (inside ``fn``), it runs ``fn`` directly.
        """
        if threading.current_thread() is self._thread:
            return fn(self._engine)
        done: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._submit(_Call(fn, done))
        return done.result(timeout)

    def shutdown(self, timeout: float | None = 10.0) -> None:
        """Stop the engine thread; pending requests get ``EngineDeadError``. Idempotent."""
        self._submit_nowait(_Stop())
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # -- submission -----------------------------------------------------------------------------
    def _submit(self, cmd: _Command) -> None:
        with self._lock:
            if self._error is not None:
                raise _copy(self._error)
            self._commands.put(cmd)
        self._engine.wake()  # an idle step waiting for a KV load returns to take the command

    def _submit_nowait(self, cmd: _Command) -> None:
        """Like ``_submit`` but silent when the engine is already dead (cleanup paths)."""
        with self._lock:
            if self._error is None:
                self._commands.put(cmd)
        self._engine.wake()

    # -- engine thread --------------------------------------------------------------------------
    def _run(self) -> None:
        eng = self._engine
        try:
            while True:
                # Idle: block until a command arrives (waking periodically while the engine
                # has housekeeping, e.g. PD exports to release). Busy: take what is queued, step.
                cmd: _Command | None = None
                if not eng.has_unfinished_requests():
                    try:
                        cmd = self._commands.get(timeout=_POLL_S if eng.needs_polling else None)
                    except queue.Empty:
                        eng.poll()
                        if self._update is not None:
                            self._resolve_update()
                        continue
                while True:
                    if cmd is not None and not self._handle(cmd):
                        for request_id in list(self._sinks):
                            eng.abort_request(request_id)  # free blocks and route leases
                        for hook in self._shutdown_hooks:
                            hook(eng)
                        self._die(EngineDeadError("the engine was shut down"))
                        return
                    try:
                        cmd = self._commands.get_nowait()
                    except queue.Empty:
                        break
                if eng.has_unfinished_requests():
                    for out in eng.step():
                        self._deliver(out)
                if self._update is not None:
                    eng.poll()  # a drained update switches here
                    self._resolve_update()
                self._admission.publish(*self._queue_state(eng))
        except BaseException as exc:  # noqa: BLE001 - anything here kills the engine
            err = EngineDeadError(f"the engine thread crashed: {exc!r}")
            err.__cause__ = exc
            self._die(err)

    def _handle(self, cmd: _Command) -> bool:
        """Execute one command on the engine thread; False means stop."""
        eng = self._engine
        if isinstance(cmd, _Add):
            try:
                if cmd.done.set_running_or_notify_cancel():
                    eng.add_request(cmd.prompt, cmd.params, cmd.request_id, cmd.kv_transfer_params)
                    self._sinks[cmd.request_id] = cmd.sink
                    cmd.done.set_result(None)
            except Exception as exc:  # ValueError: bad input; add_request mutates nothing before it succeeds
                cmd.done.set_exception(exc)
            finally:  # its waiting-queue slot is now the scheduler's (or free)
                self._admission.on_added(*self._queue_state(eng))
        elif isinstance(cmd, _AddWith):
            if cmd.done.set_running_or_notify_cancel():
                try:
                    request_id = cmd.start(eng)
                except Exception as exc:  # noqa: BLE001 - returned to the caller; start changed nothing
                    cmd.done.set_exception(exc)
                else:
                    self._sinks[request_id] = cmd.sink
                    cmd.done.set_result(request_id)
        elif isinstance(cmd, _Abort):
            out = eng.abort_request(cmd.request_id)
            if out is not None:
                self._deliver(out)
        elif isinstance(cmd, _Call):
            if cmd.done.set_running_or_notify_cancel():
                try:
                    cmd.done.set_result(cmd.fn(eng))
                except BaseException as exc:  # noqa: BLE001 - returned to the caller
                    cmd.done.set_exception(exc)
        elif isinstance(cmd, _UpdateWeights):
            if cmd.done.set_running_or_notify_cancel():
                try:
                    update = eng.begin_weight_update(cmd.state_dict, cmd.weights_version, cmd.policy)
                except Exception as exc:  # ValueError / RuntimeError: nothing changed
                    cmd.done.set_exception(exc)
                    return True
                for out in update.aborted:
                    self._deliver(out)
                self._update = (update, cmd.done)
                self._resolve_update()
        else:
            return False
        return True

    def _resolve_update(self) -> None:
        assert self._update is not None
        update, done = self._update
        if update.result is not None:
            self._update = None
            done.set_result(update.result)

    def _deliver(self, out: RequestOutput) -> None:
        sink = self._sinks.pop(out.request_id, None) if out.finished else self._sinks.get(out.request_id)
        if sink is None:
            return
        try:
            sink.put(out)
        except RuntimeError:  # the consumer's loop is closed: nobody will read this request
            self._sinks.pop(out.request_id, None)
            if not out.finished:
                self._engine.abort_request(out.request_id)

    @staticmethod
    def _queue_state(eng: LLMEngine) -> tuple[int, int]:
        """(waiting requests, free sequence slots) of the scheduler, for admission control."""
        sched = eng.scheduler
        return len(sched.waiting), max(0, sched.max_num_seqs - len(sched.running) - sched.num_loading)

    def _die(self, err: EngineDeadError) -> None:
        with self._lock:
            self._error = err
        self._dead.set()
        for sink in self._sinks.values():
            with contextlib.suppress(RuntimeError):
                sink.put(err)
        self._sinks.clear()
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                break
            if isinstance(cmd, _Add | _AddWith | _Call | _UpdateWeights) and cmd.done.set_running_or_notify_cancel():
                cmd.done.set_exception(err)
        if self._update is not None:
            self._update[1].set_exception(err)
            self._update = None

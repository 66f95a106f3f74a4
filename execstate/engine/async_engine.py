"""Asyncio front of the single-threaded engine: one thread owns ``LLMEngine``.

Contract:

- Exactly one background thread (``execstate-engine``) touches the wrapped engine. Every
  other thread talks to it through a FIFO command queue (add, abort, run a function),
  drained between steps. The thread loops ``step()`` while requests are unfinished and
  blocks on the queue when idle (no busy-wait); while loads or exports are pending
  (``needs_polling``) it wakes every 50 ms to ``poll``. A step in which every request
  waits for a KV load blocks until a load finishes or a command arrives (``LLMEngine.wake``).
- ``generate`` yields cumulative ``RequestOutput``s of one request as they are produced
  (delivered with ``loop.call_soon_threadsafe`` into a per-request asyncio queue); the
  last one has ``finished=True``. A ``ValueError`` from ``add_request`` is raised in the
  caller and leaves the engine untouched. If the consumer stops early (cancelled, the
  generator closed, a client disconnect), the request is aborted and its blocks freed.
- ``abort`` finishes a request from outside; its consumer receives the final output with
  ``finish_reason == "abort"``.
- If the engine thread crashes, every pending request and command gets an
  ``EngineDeadError`` (with the crash as ``__cause__``), ``is_healthy`` turns False and
  later calls raise ``EngineDeadError`` at once. ``shutdown`` does the same with a
  "shut down" message and joins the thread.
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
from dataclasses import dataclass
from typing import Any, TypeVar

from execstate.engine.llm_engine import LLMEngine, PromptType
from execstate.engine.outputs import RequestOutput
from execstate.engine.sampling_params import SamplingParams
from execstate.transfer.handoff import Handoff

T = TypeVar("T")


# How often an idle engine with pending housekeeping (PD exports) polls.
_POLL_S = 0.05

class EngineDeadError(RuntimeError):
    """The engine thread is gone (crashed or shut down); no request can be served."""


@dataclass
class _Sink:
    """Where a request's outputs go: an asyncio queue on the consumer's loop."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[RequestOutput | EngineDeadError]

    def put(self, item: RequestOutput | EngineDeadError) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


@dataclass
class _Add:
    prompt: PromptType
    params: SamplingParams
    request_id: str
    kv_transfer_params: dict[str, Any] | Handoff | None
    sink: _Sink
    done: concurrent.futures.Future[None]


@dataclass
class _Abort:
    request_id: str


@dataclass
class _Call:
    fn: Callable[[LLMEngine], Any]
    done: concurrent.futures.Future[Any]


class _Stop:
    pass


def _copy(err: EngineDeadError) -> EngineDeadError:
    """A fresh instance per raise: one exception object must not travel through many tasks."""
    new = EngineDeadError(str(err))
    new.__cause__ = err.__cause__
    return new


_Command = _Add | _Abort | _Call | _Stop


class AsyncEngine:
    def __init__(self, engine: LLMEngine) -> None:
        self._engine = engine
        self.tokenizer = engine.tokenizer
        self.model_config = engine.model_config
        self.max_model_len: int = engine.max_model_len
        self.return_routes: bool = engine.return_routes
        self.model_path = engine.model_path
        self._commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._sinks: dict[str, _Sink] = {}  # engine thread only
        self._lock = threading.Lock()  # guards _error against late submissions
        self._error: EngineDeadError | None = None
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

    # -- API ----------------------------------------------------------------------------------
    async def generate(
        self,
        prompt: PromptType,
        params: SamplingParams,
        request_id: str,
        kv_transfer_params: dict[str, Any] | Handoff | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Add one request (``params.n`` must be 1) and yield its outputs until finished.

        Raises ``ValueError`` (bad input, engine untouched) before yielding anything, and
        ``EngineDeadError`` if the engine dies meanwhile. Closing or cancelling the
        iterator early aborts the request.
        """
        loop = asyncio.get_running_loop()
        sink = _Sink(loop, asyncio.Queue())
        added: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._submit(_Add(prompt, params, request_id, kv_transfer_params, sink, added))
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
                        continue
                while True:
                    if cmd is not None and not self._handle(cmd):
                        for request_id in list(self._sinks):
                            eng.abort_request(request_id)  # free blocks and route leases
                        self._die(EngineDeadError("the engine was shut down"))
                        return
                    try:
                        cmd = self._commands.get_nowait()
                    except queue.Empty:
                        break
                if eng.has_unfinished_requests():
                    for out in eng.step():
                        self._deliver(out)
        except BaseException as exc:  # noqa: BLE001 - anything here kills the engine
            err = EngineDeadError(f"the engine thread crashed: {exc!r}")
            err.__cause__ = exc
            self._die(err)

    def _handle(self, cmd: _Command) -> bool:
        """Execute one command on the engine thread; False means stop."""
        eng = self._engine
        if isinstance(cmd, _Add):
            if not cmd.done.set_running_or_notify_cancel():
                return True
            try:
                eng.add_request(cmd.prompt, cmd.params, cmd.request_id, cmd.kv_transfer_params)
            except Exception as exc:  # ValueError: bad input; add_request mutates nothing before it succeeds
                cmd.done.set_exception(exc)
                return True
            self._sinks[cmd.request_id] = cmd.sink
            cmd.done.set_result(None)
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
        else:
            return False
        return True

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

    def _die(self, err: EngineDeadError) -> None:
        with self._lock:
            self._error = err
        for sink in self._sinks.values():
            with contextlib.suppress(RuntimeError):
                sink.put(err)
        self._sinks.clear()
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                break
            if isinstance(cmd, _Add | _Call) and cmd.done.set_running_or_notify_cancel():
                cmd.done.set_exception(err)

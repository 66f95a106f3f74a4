"""The engine thread: the one thread that owns an ``LLMEngine`` (``AsyncEngine``'s worker).

Contract (what ``AsyncEngine``'s docstring promises about the thread is kept here):

- ``submit(cmd)`` / ``submit_nowait(cmd)`` (any thread) queue a command
  (``engine/engine_commands.py``) and wake an idle step; ``submit`` raises the engine's
  ``EngineDeadError`` once it stopped serving, ``submit_nowait`` then drops the command (cleanup
  paths).
- The thread loops ``step()`` while requests are unfinished and blocks on the queue when idle
  (no busy-wait); while loads or exports are pending (``needs_polling``) it wakes every 50 ms to
  ``poll``. Commands run between steps, in order. Outputs go to the sink of their request (the
  final one removes it); a sink whose loop is closed aborts its request.
- Admission: after each step and each added request it publishes the scheduler's waiting
  count and free sequence slots to the ``AdmissionControl`` it was given.
- Weight updates: an update command starts ``begin_weight_update``, delivers the outputs it
  aborted, and resolves its future once the switch happened (``drain``: after the requests in
  flight finished, while the loop keeps stepping them).
- Stop (``StopCommand``): the requests in flight are aborted, the shutdown hooks run on this
  thread, then it dies with "the engine was shut down". A crash (any exception in the loop) dies
  with the crash as ``__cause__``. Dying: ``error`` is set, every sink, pending command and
  update gets the ``EngineDeadError``, ``wait_dead`` returns.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import queue
import threading
from collections.abc import Callable

from execstate.engine.admission import AdmissionControl
from execstate.engine.engine_commands import (
    AbortCommand,
    AddCommand,
    AddWithCommand,
    CallCommand,
    Command,
    EngineDeadError,
    OutputSink,
    UpdateWeightsCommand,
    copy_dead_error,
)
from execstate.engine.llm_engine import LLMEngine
from execstate.engine.outputs import RequestOutput
from execstate.engine.weight_update import WeightUpdate, WeightUpdateResult

# How often an idle engine with pending housekeeping (PD exports) polls.
_POLL_S = 0.05


class EngineThread:
    """Owns ``engine`` on a thread of its own (module docstring); ``start()`` once."""

    def __init__(self, engine: LLMEngine, admission: AdmissionControl) -> None:
        self.engine = engine
        self._admission = admission
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._sinks: dict[str, OutputSink] = {}  # this thread only
        self._update: tuple[WeightUpdate, concurrent.futures.Future[WeightUpdateResult]] | None = None  # ditto
        self._lock = threading.Lock()  # guards _error against late submissions
        self._error: EngineDeadError | None = None
        self._dead = threading.Event()
        self._shutdown_hooks: list[Callable[[LLMEngine], None]] = []
        self.thread = threading.Thread(target=self._run, name="execstate-engine", daemon=True)

    def start(self) -> None:
        self.thread.start()

    # -- health -------------------------------------------------------------------------------
    @property
    def is_healthy(self) -> bool:
        return self._error is None and self.thread.is_alive()

    @property
    def error(self) -> EngineDeadError | None:
        """Why the engine stopped serving; ``None`` while it is healthy."""
        return self._error

    def wait_dead(self, timeout: float | None = None) -> bool:
        """Block until the thread stopped serving (crash or shutdown); False on timeout."""
        return self._dead.wait(timeout)

    def is_current(self) -> bool:
        """True when called on the engine thread itself."""
        return threading.current_thread() is self.thread

    def add_shutdown_hook(self, fn: Callable[[LLMEngine], None]) -> None:
        """``fn(engine)`` runs on this thread at shutdown, after in-flight requests were aborted."""
        self._shutdown_hooks.append(fn)

    # -- submission (any thread) ----------------------------------------------------------------
    def submit(self, cmd: Command) -> None:
        with self._lock:
            if self._error is not None:
                raise copy_dead_error(self._error)
            self._commands.put(cmd)
        self.engine.wake()  # an idle step waiting for a KV load returns to take the command

    def submit_nowait(self, cmd: Command) -> None:
        """Like ``submit`` but silent when the engine is already dead (cleanup paths)."""
        with self._lock:
            if self._error is None:
                self._commands.put(cmd)
        self.engine.wake()

    # -- the loop (this thread only) -----------------------------------------------------------
    def _run(self) -> None:
        eng = self.engine
        try:
            while True:
                # Idle: block until a command arrives (waking periodically while the engine
                # has housekeeping, e.g. PD exports to release). Busy: take what is queued, step.
                cmd: Command | None = None
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

    def _handle(self, cmd: Command) -> bool:
        """Execute one command on the engine thread; False means stop."""
        eng = self.engine
        if isinstance(cmd, AddCommand):
            try:
                if cmd.done.set_running_or_notify_cancel():
                    eng.add_request(cmd.prompt, cmd.params, cmd.request_id, cmd.kv_transfer_params, cmd.scope)
                    self._sinks[cmd.request_id] = cmd.sink
                    cmd.done.set_result(None)
            except Exception as exc:  # ValueError: bad input; add_request mutates nothing before it succeeds
                cmd.done.set_exception(exc)
            finally:  # its waiting-queue slot is now the scheduler's (or free)
                self._admission.on_added(*self._queue_state(eng))
        elif isinstance(cmd, AddWithCommand):
            if cmd.done.set_running_or_notify_cancel():
                try:
                    request_id = cmd.start(eng)
                except Exception as exc:  # noqa: BLE001 - returned to the caller; start changed nothing
                    cmd.done.set_exception(exc)
                else:
                    self._sinks[request_id] = cmd.sink
                    cmd.done.set_result(request_id)
        elif isinstance(cmd, AbortCommand):
            out = eng.abort_request(cmd.request_id)
            if out is not None:
                self._deliver(out)
        elif isinstance(cmd, CallCommand):
            if cmd.done.set_running_or_notify_cancel():
                try:
                    cmd.done.set_result(cmd.fn(eng))
                except BaseException as exc:  # noqa: BLE001 - returned to the caller
                    cmd.done.set_exception(exc)
        elif isinstance(cmd, UpdateWeightsCommand):
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
                self.engine.abort_request(out.request_id)

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
            if (
                isinstance(cmd, AddCommand | AddWithCommand | CallCommand | UpdateWeightsCommand)
                and cmd.done.set_running_or_notify_cancel()
            ):
                cmd.done.set_exception(err)
        if self._update is not None:
            self._update[1].set_exception(err)
            self._update = None

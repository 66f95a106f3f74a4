"""One thread that moves state off the caller's thread: the skeleton every transfer mover shares.

The PD load worker (``load_worker.py``), the offload reload worker (``offload_loader.py``) and the
write-back worker (``offload_writer.py``) each give a :class:`JobThread` their job handler; the
queueing, cancellation, results, flushing, exception isolation and shutdown are written once here.

Contract:

- :meth:`submit` (any thread, never blocks) queues a job; jobs run one at a time, in submission
  order, on the thread named ``name``.
- :meth:`cancel` (any thread): a job whose ``job_id`` attribute is that id and that has not
  started is not run; its result is ``skipped(job)``.
- ``handle(job)`` runs a job and returns its result (``None``: nothing to report). If it raises,
  the thread lives on and the result is ``failed(job, exc)``: one result per job, always.
- :meth:`results` (the owner) drains the results in completion order; ``on_result`` (optional) is
  called on the thread after each result is queued (e.g. to wake the engine thread).
- ``tick()`` (optional) runs after every job, and every ``tick_s()`` seconds while idle when that
  returns a number (``None``: wait for the next job); the results it returns are queued too.
- ``on_drained`` (optional) runs on the thread when a job ends and none is left, before
  :meth:`flush` returns: whoever flushes sees its effects. It must not block.
- :meth:`close` lets the jobs queued before it run (``handle`` sees :attr:`stopping` true and may
  skip them) and stops the thread; then ``on_close`` runs on the thread.
- ``niceness``: added to the thread's CPU priority (a background mover gives way to the forward pass).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

logger = logging.getLogger("execstate.transfer")

J = TypeVar("J")
R = TypeVar("R")


class _Stop:
    pass


class JobThread(Generic[J, R]):
    def __init__(self, name: str, handle: Callable[[J], R | None], *,
                 skipped: Callable[[J], R | None] = lambda job: None,
                 failed: Callable[[J, Exception], R | None] = lambda job, exc: None,
                 on_result: Callable[[], object] | None = None,
                 tick: Callable[[], Iterable[R]] | None = None, tick_s: Callable[[], float | None] = lambda: None,
                 on_drained: Callable[[], object] | None = None, on_close: Callable[[], object] | None = None,
                 niceness: int = 0) -> None:
        self._handle, self._skipped, self._failed = handle, skipped, failed
        self.on_result, self._tick, self._tick_s = on_result, tick, tick_s
        self._on_drained, self._on_close, self._niceness = on_drained, on_close, niceness
        self._jobs: queue.SimpleQueue[J | _Stop] = queue.SimpleQueue()
        self._results: queue.SimpleQueue[R] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._cancelled: set[int] = set()
        self._idle = threading.Condition()
        self._pending = 0
        self.stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # -- the owner's side (any thread) ------------------------------------------------------------

    def submit(self, job: J) -> None:
        with self._idle:
            self._pending += 1
        self._jobs.put(job)

    def cancel(self, job_id: int) -> None:
        with self._lock:
            self._cancelled.add(job_id)

    def results(self) -> list[R]:
        out: list[R] = []
        while True:
            try:
                out.append(self._results.get_nowait())
            except queue.Empty:
                return out

    @property
    def has_results(self) -> bool:
        return not self._results.empty()

    @property
    def num_pending(self) -> int:
        return self._pending

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait until every submitted job is done; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def close(self, timeout: float | None = 30.0) -> None:
        self._jobs.put(_Stop())
        self._thread.join(timeout)

    # -- the thread ----------------------------------------------------------------------------------

    def _run(self) -> None:
        if self._niceness:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(),
                               os.getpriority(os.PRIO_PROCESS, 0) + self._niceness)
        try:
            while True:
                try:
                    job = self._jobs.get(timeout=self._tick_s())
                except queue.Empty:
                    job = None
                if isinstance(job, _Stop):
                    self.stopping = True
                elif job is not None:
                    self._one(job)
                if self._tick is not None:
                    for item in self._tick():
                        self._emit(item)
                if self.stopping and self._jobs.empty():
                    return
        finally:
            if self._on_close is not None:
                self._on_close()

    def _one(self, job: J) -> None:
        try:
            job_id = getattr(job, "job_id", None)
            with self._lock:
                cancelled = job_id in self._cancelled
                self._cancelled.discard(job_id)
            try:
                result = self._skipped(job) if cancelled else self._handle(job)
            except Exception as exc:  # one job's failure never stops the thread
                logger.exception("%s: a job failed", self._thread.name)
                result = self._failed(job, exc)
            if result is not None:
                self._emit(result)
        finally:
            self._finish()

    def _finish(self) -> None:
        with self._idle:
            last = self._pending == 1
        if last and self._on_drained is not None:  # before the count drops: flush() waits for it
            try:
                self._on_drained()
            except Exception:  # noqa: BLE001 - a drain hook never stops the mover
                logger.exception("%s: on_drained failed", self._thread.name)
        with self._idle:
            self._pending -= 1
            if self._pending == 0:
                self._idle.notify_all()

    def _emit(self, item: R) -> None:
        self._results.put(item)
        if self.on_result is not None:
            self.on_result()

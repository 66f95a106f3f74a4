"""``ToolThreads``: an executor for sync tools whose threads never hold up the process's exit.

A sync tool cannot be stopped once it runs: after its timeout (``backend.TaskLimits``) its thread
runs on and its result is dropped. In a ``ThreadPoolExecutor`` (asyncio's default pool too) such
a thread would also hold a worker for good and, at exit, keep the interpreter waiting for it.
``ToolThreads`` runs each call on its own daemon thread, at most ``max_workers`` at once (the
others wait for a slot, in their threads); a call cancelled before it started never runs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any


class ToolThreads(Executor):
    def __init__(self, max_workers: int, name: str = "execstate-tool") -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be >= 1")
        self._slots = threading.BoundedSemaphore(max_workers)
        self._name = name

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()

        def run() -> None:
            with self._slots:
                if not future.set_running_or_notify_cancel():
                    return
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:  # noqa: BLE001 - the caller reads it from the future
                    future.set_exception(exc)

        threading.Thread(target=run, name=self._name, daemon=True).start()
        return future

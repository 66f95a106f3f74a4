"""A replica's copy loop: its live sessions copied to the shared tier every ``copy_every_s``
(``session/lm/shared_copy.py``; docs/fleet.md "A replica lost").

:class:`CopyLoop` runs on its own thread: each turn, :meth:`SharedCopies.due` on the engine
thread (through ``AsyncSessions.call``), then :meth:`SharedCopies.publish` here. Started by
:class:`~execstate.fleet.ray_app.engine_replica.EngineReplica` when the replica has a Redis tier;
:meth:`stop` ends it (the replica's shutdown). Imports no Ray.
"""

from __future__ import annotations

import logging
import threading

from execstate.engine.async_engine import AsyncEngine
from execstate.session.lm.async_sessions import AsyncSessions
from execstate.session.lm.shared_copy import SharedCopies

logger = logging.getLogger("execstate.fleet")


class CopyLoop:
    def __init__(self, engine: AsyncEngine, sessions: AsyncSessions, every_s: float) -> None:
        if every_s <= 0:
            raise ValueError(f"the copy period must be > 0 s, got {every_s}")
        self.engine, self.sessions, self.every_s = engine, sessions, every_s
        self.copies = SharedCopies()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="execstate-session-copies", daemon=True)

    def start(self) -> CopyLoop:
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def turn(self) -> int:
        """One sweep (build on the engine thread, publish here); the copies put."""
        sweep = self.sessions.call(self.copies.due, timeout=30)
        if sweep.manifests is None:
            return 0
        return self.copies.publish(sweep, sweep.manifests)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            if not self.engine.is_healthy:
                return
            try:
                self.turn()
            except Exception:  # noqa: BLE001 - a copy must never stop the replica; the next turn retries
                logger.exception("copying the live sessions to the shared tier failed")

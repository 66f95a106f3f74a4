"""Which realtime connection holds which session, and the grace period of detached sessions.

Event loop only (no locks, no engine calls of its own besides the ``close`` it is given).
Sessions are named by their :data:`SessionKey` (tenant, id): ids live in their tenant's namespace
(``session/runtime/access.py``), so two tenants' ``demo`` are two entries, and a connection only
ever names its own tenant's sessions. The engine side knows every session a realtime connection
created, forked or resumed as *held* by the realtime kind of connection (the HTTP session API
gets ``session_in_use`` for them); which of the tenant's live connections drives it is decided here.

- A session opened (``session.create``) or forked (``session.fork``) over a connection is *owned*
  by that connection; the connection *attaches* (drives) at most one of its sessions.
- ``resume(conn, sid)`` attaches ``sid`` to ``conn`` and makes ``conn`` its owner, unless another
  live connection has it attached (``session_in_use``). So a fork can be driven from a second
  connection while its creator lives, and a session detached by a disconnect can be picked up
  within the grace period. A session this registry never saw (opened by another front, or
  migrated in) may be resumed too; the caller checks that the engine knows it.
- ``disconnect(conn)``: every session ``conn`` owns is closed at once (``grace_s == 0``) or kept
  *detached* for ``grace_s`` seconds and closed then unless resumed meanwhile.
- ``forget(sid)``: the session was closed by its client (or found ended).

Every owned session is released exactly once: by its client's ``session.close``, by the
disconnect (or its grace timer), or by the engine's shutdown hook (``AsyncSessions``).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import NewType

from execstate.engine.async_engine import EngineDeadError
from execstate.identity.tenant import TenantId
from execstate.serve.realtime.errors import EventId, ProtocolError
from execstate.session.runtime.events import SessionEventError

ConnId = NewType("ConnId", int)
SessionKey = tuple[TenantId, str]
"""A session as this registry names it: (its tenant, its id)."""

logger = logging.getLogger(__name__)


@dataclass
class Entry:
    owner: ConnId | None  # None while detached
    return_routes: bool
    timer: asyncio.TimerHandle | None = None


class SessionOwners:
    def __init__(self, close: Callable[[SessionKey], Awaitable[object]], grace_s: float) -> None:
        if not (math.isfinite(grace_s) and grace_s >= 0):
            raise ValueError(f"the realtime grace period must be a finite number of seconds >= 0, got {grace_s!r}")
        self._close = close
        self.grace_s = grace_s
        self._entries: dict[SessionKey, Entry] = {}
        self._attached: dict[ConnId, SessionKey] = {}
        self._next_conn = 0
        self._closing: set[asyncio.Task[None]] = set()
        self._closing_ids: set[SessionKey] = set()  # being closed for a gone connection: not resumable

    def new_connection(self) -> ConnId:
        self._next_conn += 1
        return ConnId(self._next_conn)

    # -- queries ------------------------------------------------------------------------------------
    def owned(self, conn: ConnId) -> list[SessionKey]:
        return [sid for sid, e in self._entries.items() if e.owner == conn]

    def detached(self) -> list[SessionKey]:
        return [sid for sid, e in self._entries.items() if e.owner is None]

    def return_routes(self, sid: SessionKey) -> bool:
        e = self._entries.get(sid)
        return e is not None and e.return_routes

    @property
    def num_sessions(self) -> int:
        return len(self._entries)

    # -- transitions --------------------------------------------------------------------------------
    def claim(self, conn: ConnId, sid: SessionKey, return_routes: bool, attach: bool) -> None:
        """A session just opened or forked over ``conn``."""
        self._entries[sid] = Entry(conn, return_routes)
        if attach:
            self._attached[conn] = sid

    def resume(self, conn: ConnId, sid: SessionKey, event_id: EventId = None) -> bool:
        """Attach ``sid`` to ``conn``; its ``return_routes`` default. ``session_in_use`` if another
        live connection has it attached."""
        if sid in self._closing_ids:
            raise ProtocolError("closed", f"session {sid[1]!r} is being closed (its connection ended)", event_id)
        e = self._entries.get(sid)
        if e is not None and e.owner is not None and e.owner != conn and self._attached.get(e.owner) == sid:
            raise ProtocolError("session_in_use", f"session {sid[1]!r} is attached to another live connection",
                                event_id)
        if e is None:
            e = self._entries[sid] = Entry(conn, False)
        if e.timer is not None:
            e.timer.cancel()
            e.timer = None
        e.owner = conn
        self._attached[conn] = sid
        return e.return_routes

    def detach(self, conn: ConnId) -> None:
        """``conn`` no longer drives its attached session (it stays owned)."""
        self._attached.pop(conn, None)

    def forget(self, sid: SessionKey) -> None:
        e = self._entries.pop(sid, None)
        if e is not None and e.timer is not None:
            e.timer.cancel()
        for conn, attached in list(self._attached.items()):
            if attached == sid:
                del self._attached[conn]

    async def disconnect(self, conn: ConnId) -> None:
        """``conn`` is gone: close its sessions now, or detach them for the grace period."""
        self._attached.pop(conn, None)
        sids = self.owned(conn)
        if self.grace_s == 0:
            for sid in sids:
                self._entries.pop(sid, None)
                self._closing_ids.add(sid)
            for sid in sids:
                await self._close_quietly(sid)
            return
        loop = asyncio.get_running_loop()
        for sid in sids:
            e = self._entries[sid]
            e.owner = None
            e.timer = loop.call_later(self.grace_s, self._expire, sid)

    def _expire(self, sid: SessionKey) -> None:
        e = self._entries.get(sid)
        if e is None or e.owner is not None:
            return
        del self._entries[sid]
        self._closing_ids.add(sid)
        task = asyncio.get_running_loop().create_task(self._close_quietly(sid))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _close_quietly(self, sid: SessionKey) -> None:
        """Close a session no client holds any more; it may already be gone (closed, evicted, engine down)."""
        try:
            await self._close(sid)
            logger.debug("realtime session %s closed (no connection holds it)", sid[1])
        except (SessionEventError, EngineDeadError) as exc:
            logger.debug("realtime session %s: close: %s", sid[1], exc)
        except Exception:
            logger.exception("realtime session %s: close failed", sid[1])
        finally:
            self._closing_ids.discard(sid)

"""SessionManager: the resident sessions of one engine, their ids, capacity and eviction
(docs/ARCHITECTURE.md 6, 8). Pure Python, independent of the session kind.

- **Ids**: strings of 1 to 128 characters from ``[A-Za-z0-9._:-]``, chosen by the client or
  generated (``sess-`` + 16 hex digits). An id is unique among resident sessions; the id of an
  ended (closed or evicted) session may be reused.
- **Capacity**: at most ``max_sessions`` resident sessions (OPEN, STEPPING or FAILED; forks
  count). Admitting one more: without an eviction policy (``eviction=None``) the open fails with
  code ``capacity``; with ``eviction="lru"`` the idle session (OPEN or FAILED, never STEPPING)
  whose last step (or open) is the oldest is evicted first; if none is idle, ``capacity``.
- **KV pressure**: ``reclaim`` (installed as the engine's block-holds reclaimer by the kind's
  front) evicts the least recently used idle session under the same policy; without a policy it
  evicts nothing.
- An evicted session releases its state and checkpoints at once; later calls on it raise
  ``evicted``. Ended sessions are remembered (the newest 1024) so that a call on one says
  ``closed`` or ``evicted`` rather than ``not_found``.
- ``close_all`` closes every resident session (engine shutdown). Every release happens once.
"""

from __future__ import annotations

import itertools
import re
import secrets
from collections import OrderedDict
from collections.abc import Callable

from execstate.session.runtime.events import EventQueue, SessionEventError
from execstate.session.runtime.lifecycle import Checkpoint, SessionRuntime, SessionStatus

EVICTION_POLICIES = (None, "lru")
SESSION_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_REMEMBER_ENDED = 1024


def check_session_id(session_id: object) -> str:
    """``session_id`` if it is a valid id, else SessionEventError ``invalid``."""
    if not isinstance(session_id, str) or not SESSION_ID_RE.fullmatch(session_id):
        raise SessionEventError("invalid", f"a session id is 1-128 characters from [A-Za-z0-9._:-], got {session_id!r}")
    return session_id


def new_session_id() -> str:
    return f"sess-{secrets.token_hex(8)}"


class SessionManager:
    def __init__(self, max_sessions: int = 64, eviction: str | None = None) -> None:
        if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 1:
            raise ValueError(f"max_sessions must be an int >= 1, got {max_sessions!r}")
        if eviction not in EVICTION_POLICIES:
            raise ValueError(f"session eviction must be one of {EVICTION_POLICIES}, got {eviction!r}")
        self.max_sessions = max_sessions
        self.eviction = eviction
        self._resident: dict[str, SessionRuntime] = {}
        self._ended: OrderedDict[str, SessionRuntime] = OrderedDict()
        self._clock = itertools.count(1)
        self.num_evicted = 0

    # -- queries ---------------------------------------------------------------------------------
    @property
    def num_resident(self) -> int:
        return len(self._resident)

    def resident(self) -> list[SessionRuntime]:
        return list(self._resident.values())

    def get(self, session_id: str) -> SessionRuntime:
        """The session (resident or recently ended); ``not_found`` otherwise."""
        rt = self._resident.get(session_id) or self._ended.get(session_id)
        if rt is None:
            raise SessionEventError("not_found", f"no session {session_id!r}")
        return rt

    def tick(self) -> int:
        """The LRU clock's next value (a step ended, a session opened)."""
        return next(self._clock)

    # -- admission ---------------------------------------------------------------------------------
    def admit(self, session_id: str | None) -> str:
        """Validate (or generate) the id of a session about to open and make room for it (evicting
        under the policy). Raises ``invalid`` (bad or resident id) or ``capacity``; nothing is
        evicted when the id is refused."""
        sid = new_session_id() if session_id is None else check_session_id(session_id)
        if sid in self._resident:
            raise SessionEventError("invalid", f"session id {sid!r} is already open")
        while len(self._resident) >= self.max_sessions:
            if not self.evict_lru(f"evicted (least recently used) to admit session {sid!r}"):
                raise SessionEventError(
                    "capacity", f"{len(self._resident)} sessions are resident (max_sessions={self.max_sessions})"
                    + ("; none is idle" if self.eviction else "; close one or enable eviction"))
        return sid

    def add(self, rt: SessionRuntime) -> SessionRuntime:
        """Register a session that ``admit`` made room for."""
        if rt.session_id in self._resident or len(self._resident) >= self.max_sessions:
            raise SessionEventError("capacity", f"no room for session {rt.session_id!r}: call admit first")
        self._ended.pop(rt.session_id, None)
        rt.last_active = self.tick()
        self._resident[rt.session_id] = rt
        return rt

    def fork(self, session_id: str, checkpoint: Checkpoint | str | None, new_session_id: str | None,
             new_queue: Callable[[], EventQueue]) -> SessionRuntime:
        """A new resident session (new id, new branch id) from ``checkpoint`` of ``session_id``
        (None: its current state): the kind's ``fork_parts`` (shared blocks, its own generator in
        the same state), the pending events in a fresh queue (``new_queue``), the same step index
        and epoch. The parent is touched first, so it is never the LRU victim of its own fork."""
        rt = self.get(session_id)
        rt.require(SessionStatus.OPEN)
        cp = None if checkpoint is None else rt.resolve_checkpoint(checkpoint)
        rt.last_active = self.tick()
        sid = self.admit(new_session_id)
        state, events, step_index, epoch = rt.fork_parts(cp)
        queue = new_queue()
        queue.restore(events)
        return self.add(SessionRuntime(sid, state, queue, secrets.token_hex(8), step_index, epoch))

    # -- end of life -------------------------------------------------------------------------------
    def close(self, session_id: str) -> bool:
        """Close a session (idempotent; closing an unknown id raises ``not_found``)."""
        rt = self.get(session_id)
        released = rt.close()
        self._forget(rt)
        return released

    def evict_lru(self, reason: str) -> bool:
        """Evict the least recently used idle session under the policy; False if none may go."""
        if self.eviction != "lru":
            return False
        idle = [rt for rt in self._resident.values() if rt.status in (SessionStatus.OPEN, SessionStatus.FAILED)]
        if not idle:
            return False
        victim = min(idle, key=lambda rt: rt.last_active)
        victim.evict(reason)
        self.num_evicted += 1
        self._forget(victim)
        return True

    def reclaim(self) -> bool:
        """KV pressure (the engine's block holds): evict one idle session under the policy."""
        return self.evict_lru("evicted (least recently used) under KV cache pressure")

    def close_all(self) -> None:
        for rt in list(self._resident.values()):
            rt.close()
            self._forget(rt)

    def _forget(self, rt: SessionRuntime) -> None:
        if self._resident.get(rt.session_id) is rt:
            del self._resident[rt.session_id]
        self._ended[rt.session_id] = rt
        self._ended.move_to_end(rt.session_id)
        while len(self._ended) > _REMEMBER_ENDED:
            self._ended.popitem(last=False)

"""``SessionHandle``: what an offline session object is, whatever its kind.

A handle is a session id plus the sessions object that owns the session (a
:class:`KindSessions`: ``LMSessions`` or ``WorldSessions``, ``session/runtime/sessions.py``) and
the session's runtime (``session/runtime/lifecycle.py``). The state it reports (status, step
index, event epoch, branch, checkpoints, state key) comes from the runtime; every operation goes
to the sessions object, which applies it under its own rules (capacity, events, block
references). The kinds add their own ``step`` and ``migrate`` (``session/lm/offline.py``:
``Session``; ``session/world/offline.py``: ``WorldSession``).
"""

from __future__ import annotations

from typing import Any, Self

from execstate.session.runtime.access import Access
from execstate.session.runtime.checkpoint import Checkpoint
from execstate.session.runtime.events import EventAck
from execstate.session.runtime.lifecycle import SessionRuntime
from execstate.session.runtime.sessions import KindSessions


class SessionHandle:
    def __init__(self, sessions: KindSessions[Any], rt: SessionRuntime) -> None:
        self._sessions = sessions
        self._rt = rt
        self.session_id = rt.session_id
        self._access = Access(rt.owner, rt.holder)  # every call asks as the session's own owner

    # -- state ------------------------------------------------------------------------------------
    @property
    def access(self) -> Access:
        """Who this handle asks as: the session's own owner (``session/runtime/access.py``)."""
        return self._access

    @property
    def sessions(self) -> KindSessions[Any]:
        """The sessions object that owns this session."""
        return self._sessions

    @property
    def status(self) -> str:
        return self._rt.status.value

    @property
    def step_index(self) -> int:
        return self._rt.step_index

    @property
    def event_epoch(self) -> int:
        return self._rt.event_epoch

    @property
    def branch_id(self) -> str:
        return self._rt.branch_id

    @property
    def checkpoints(self) -> list[Checkpoint]:
        return self._rt.checkpoints

    def state_key(self) -> bytes:
        """The session state key (identity/session_keys.py)."""
        return self._rt.state_key()

    def info(self) -> Any:
        """The kind's info record (``SessionInfo`` / ``WorldSessionInfo``)."""
        return self._sessions.info(self.session_id, self._access)

    # -- operations --------------------------------------------------------------------------------
    def submit_event(self, event_id: int, kind: str, data: Any = None) -> EventAck:
        return self._sessions.submit_event(self.session_id, event_id, kind, data, self._access)

    def checkpoint(self) -> Checkpoint:
        return self._sessions.checkpoint(self.session_id, self._access)

    def rollback(self, checkpoint: Checkpoint | str) -> None:
        self._sessions.rollback(self.session_id, checkpoint, self._access)

    def release_checkpoint(self, checkpoint: Checkpoint | str) -> None:
        self._sessions.release_checkpoint(self.session_id, checkpoint, self._access)

    def fork(self, checkpoint: Checkpoint | str | None = None, session_id: str | None = None) -> Self:
        """A new session of the same kind from ``checkpoint`` (None: the current state)."""
        return type(self)(self._sessions, self._sessions.fork(self.session_id, checkpoint, session_id, self._access))

    def reset(self) -> None:
        self._sessions.reset(self.session_id, self._access)

    def close(self) -> None:
        self._sessions.close(self.session_id, self._access)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.session_id!r}, {self.status}, step {self.step_index})"

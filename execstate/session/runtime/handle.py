"""``SessionHandle``: what an offline session object is, whatever its kind.

A handle is a session id plus the manager that owns the session (``LMSessions`` or
``WorldSessions``) and the session's runtime (``runtime.py``). The state it reports (status,
step index, event epoch, branch, checkpoints, state key) comes from the runtime; every
operation goes to the manager, which applies it under its own rules (capacity, events, block
references). The kinds add their own ``step`` and ``migrate`` (``offline.Session``,
``world_offline.WorldSession``).
"""

from __future__ import annotations

from typing import Any, Protocol, Self

from execstate.session.events import EventAck
from execstate.session.runtime import Checkpoint, SessionRuntime


class SessionOps(Protocol):
    """The per-session operations both session managers provide."""

    def info(self, session_id: str) -> Any: ...
    def submit_event(self, session_id: str, event_id: int, kind: str, data: Any = None) -> EventAck: ...
    def checkpoint(self, session_id: str) -> Checkpoint: ...
    def rollback(self, session_id: str, checkpoint: Checkpoint | str) -> None: ...
    def release_checkpoint(self, session_id: str, checkpoint: Checkpoint | str) -> None: ...
    def reset(self, session_id: str) -> None: ...
    def fork(self, session_id: str, checkpoint: Checkpoint | str | None = None,
             new_session_id: str | None = None) -> SessionRuntime: ...
    def close(self, session_id: str) -> bool: ...


class SessionHandle:
    def __init__(self, sessions: SessionOps, rt: SessionRuntime) -> None:
        self._sessions = sessions
        self._rt = rt
        self.session_id = rt.session_id

    # -- state ------------------------------------------------------------------------------------
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

    # -- operations --------------------------------------------------------------------------------
    def submit_event(self, event_id: int, kind: str, data: Any = None) -> EventAck:
        return self._sessions.submit_event(self.session_id, event_id, kind, data)

    def checkpoint(self) -> Checkpoint:
        return self._sessions.checkpoint(self.session_id)

    def rollback(self, checkpoint: Checkpoint | str) -> None:
        self._sessions.rollback(self.session_id, checkpoint)

    def release_checkpoint(self, checkpoint: Checkpoint | str) -> None:
        self._sessions.release_checkpoint(self.session_id, checkpoint)

    def fork(self, checkpoint: Checkpoint | str | None = None, session_id: str | None = None) -> Self:
        """A new session of the same kind from ``checkpoint`` (None: the current state)."""
        return type(self)(self._sessions, self._sessions.fork(self.session_id, checkpoint, session_id))

    def reset(self) -> None:
        self._sessions.reset(self.session_id)

    def close(self) -> None:
        self._sessions.close(self.session_id)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.session_id!r}, {self.status}, step {self.step_index})"

"""The state machine of one realtime connection (pure Python: no engine, no server).

A connection drives at most one session at a time (its *attached* session) and runs at most one
response (a step) at a time::

    NO_SESSION --session.created / session.resumed--> READY
    READY --response.created--> RESPONDING --response.done--> READY
    READY | RESPONDING --session.closed--> NO_SESSION
    any --disconnect--> GONE

``check(type)`` says whether a client message may be acted on now, or raises the
``ProtocolError`` the client gets instead (the server answers it with an ``error`` event and
keeps the connection):

- ``no_session``: anything but ``session.create`` / ``session.resume`` while no session is attached;
- ``session_exists``: ``session.create`` / ``session.resume`` while one is attached (close it first);
- ``response_in_progress``: while a response runs, only ``event.submit`` (queued for the next
  step), ``response.cancel``, ``session.get`` and ``session.close`` (which cancels the response);
- ``no_response``: ``response.cancel`` with no response in progress (including one that has
  already sent its ``response.done``).

Which messages are answered how, and in what order, is ``realtime_conn.py``'s business; this
class only keeps the phase and the attached session's per-connection options.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from execstate.serve.realtime_protocol import ClientEventId, ProtocolError

OPENING = frozenset({"session.create", "session.resume"})
WHILE_RESPONDING = frozenset({"event.submit", "response.cancel", "session.get", "session.close"})


class Phase(enum.Enum):
    NO_SESSION = "no_session"
    READY = "ready"
    RESPONDING = "responding"
    GONE = "gone"


@dataclass
class ConnectionState:
    phase: Phase = Phase.NO_SESSION
    session_id: str | None = None
    return_routes: bool = False  # the attached session's default for response.done
    response_id: str | None = None

    def check(self, msg_type: str, event_id: ClientEventId = None) -> None:
        """Raise the ``ProtocolError`` for ``msg_type`` in this phase, if it is not allowed."""
        if self.phase is Phase.GONE:
            raise ProtocolError("connection_closed", "the connection is closing", event_id)
        if self.phase is Phase.NO_SESSION:
            if msg_type not in OPENING:
                raise ProtocolError("no_session", f"{msg_type}: no session on this connection; send "
                                    "session.create or session.resume first", event_id)
            return
        if msg_type in OPENING:
            raise ProtocolError("session_exists", f"{msg_type}: this connection already has session "
                                f"{self.session_id!r}; send session.close first", event_id)
        if self.phase is Phase.RESPONDING and msg_type not in WHILE_RESPONDING:
            raise ProtocolError("response_in_progress", f"{msg_type}: response {self.response_id!r} is in "
                                "progress; wait for its response.done or send response.cancel", event_id)
        if self.phase is Phase.READY and msg_type == "response.cancel":
            raise ProtocolError("no_response", "response.cancel: no response is in progress", event_id)

    # -- transitions ------------------------------------------------------------------------------
    def attach(self, session_id: str, return_routes: bool) -> None:
        self._expect(Phase.NO_SESSION)
        self.phase, self.session_id, self.return_routes = Phase.READY, session_id, return_routes

    def begin_response(self, response_id: str) -> None:
        self._expect(Phase.READY)
        self.phase, self.response_id = Phase.RESPONDING, response_id

    def end_response(self, response_id: str) -> None:
        """The response's ``response.done`` was sent (a no-op once the session left or the connection went)."""
        if self.phase is Phase.RESPONDING and self.response_id == response_id:
            self.phase, self.response_id = Phase.READY, None

    def detach(self) -> None:
        """The attached session was closed (its response, if any, has ended)."""
        if self.phase is not Phase.GONE:
            self.phase, self.session_id, self.response_id, self.return_routes = Phase.NO_SESSION, None, None, False

    def gone(self) -> None:
        self.phase = Phase.GONE

    def _expect(self, phase: Phase) -> None:
        if self.phase is not phase:
            raise RuntimeError(f"connection state {self.phase.value}, expected {phase.value}")

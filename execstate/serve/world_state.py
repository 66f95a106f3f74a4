"""The state machine of one world-session connection (pure Python: no model, no server).

A connection runs at most one world session at a time::

    NO_SESSION --video.start--> RUNNING --session.paused--> PAUSED --session.resumed--> RUNNING
    RUNNING | PAUSED --session.done (session.stop, num_frames reached, step failed)--> NO_SESSION
    any --disconnect--> GONE

``check(type)`` says whether a client message may be acted on now, or raises the
``WorldProtocolError`` the client gets instead (answered with an ``error`` event; the connection
stays open):

- ``no_session``: anything but ``session.start`` / ``session.ping`` while no session runs;
- ``session_exists``: ``session.start`` while one runs (``session.stop`` it first);
- ``already_paused`` / ``not_paused``: ``session.pause`` while paused, ``session.resume`` while running;
- ``connection_closed``: anything once the socket is gone.

Every other message is allowed while a session runs or is paused (events queue for the next
chunk boundary either way). Which messages are answered how is ``world_conn.py``'s business.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from execstate.serve.world_protocol import ClientEventId, WorldProtocolError

ALWAYS = frozenset({"session.ping"})


class Phase(enum.Enum):
    NO_SESSION = "no_session"
    RUNNING = "running"
    PAUSED = "paused"
    GONE = "gone"


@dataclass
class WorldConnState:
    phase: Phase = Phase.NO_SESSION
    request_id: str | None = None

    def check(self, msg_type: str, event_id: ClientEventId = None) -> None:
        """Raise the ``WorldProtocolError`` for ``msg_type`` in this phase, if it is not allowed."""
        if self.phase is Phase.GONE:
            raise WorldProtocolError("connection_closed", "the connection is closing", event_id)
        if msg_type in ALWAYS:
            return
        if self.phase is Phase.NO_SESSION:
            if msg_type != "session.start":
                raise WorldProtocolError("no_session", f"{msg_type}: no world session on this connection; send "
                                         "session.start first", event_id)
            return
        if msg_type == "session.start":
            raise WorldProtocolError("session_exists", f"session {self.request_id} is running on this connection; "
                                     "send session.stop first", event_id)
        if msg_type == "session.pause" and self.phase is Phase.PAUSED:
            raise WorldProtocolError("already_paused", "the session is already paused", event_id)
        if msg_type == "session.resume" and self.phase is Phase.RUNNING:
            raise WorldProtocolError("not_paused", "the session is not paused", event_id)

    def started(self, request_id: str) -> None:
        assert self.phase is Phase.NO_SESSION, self.phase
        self.phase, self.request_id = Phase.RUNNING, request_id

    def paused(self) -> None:
        assert self.phase is Phase.RUNNING, self.phase
        self.phase = Phase.PAUSED

    def resumed(self) -> None:
        assert self.phase is Phase.PAUSED, self.phase
        self.phase = Phase.RUNNING

    def done(self) -> None:
        if self.phase is not Phase.GONE:
            self.phase, self.request_id = Phase.NO_SESSION, None

    def gone(self) -> None:
        self.phase = Phase.GONE

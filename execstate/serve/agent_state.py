"""The state machine of one agent connection (pure Python: no engine, no server).

A connection drives at most one agent at a time::

    NO_SESSION --session.created--> ACTIVE --session.closed--> NO_SESSION
    ACTIVE --the agent stopped by itself (front failed, events overflowed)--> ENDED
    ENDED --session.closed--> NO_SESSION
    any --disconnect--> GONE

``check(type, event_id)`` says whether a client message may be acted on now, or raises the
``ProtocolError`` the client gets instead (answered with an ``error`` event; the connection stays):

- ``no_session``: anything but ``session.create`` while no agent is open;
- ``session_exists``: ``session.create`` while one is open (send ``session.close`` first);
- ``session_ended``: anything but ``session.close`` once the agent stopped by itself (its
  ``error`` event said why);
- ``connection_closed``: anything after the socket went.

Whether a response is in flight is the agent's business (``response.cancel`` without one gets
``no_response`` from the connection), since responses start and end on the agent's own clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from execstate.serve.realtime_protocol import ClientEventId, ProtocolError

OPENING = "session.create"
CLOSING = "session.close"


class Phase(enum.Enum):
    NO_SESSION = "no_session"
    ACTIVE = "active"
    ENDED = "ended"
    GONE = "gone"


@dataclass
class AgentConnState:
    phase: Phase = Phase.NO_SESSION
    session_id: str | None = None

    def check(self, msg_type: str, event_id: ClientEventId = None) -> None:
        if self.phase is Phase.GONE:
            raise ProtocolError("connection_closed", "the connection is closing", event_id)
        if self.phase is Phase.NO_SESSION:
            if msg_type != OPENING:
                raise ProtocolError("no_session", f"{msg_type}: no agent session on this connection; send "
                                    "session.create first", event_id)
            return
        if msg_type == OPENING:
            raise ProtocolError("session_exists", f"{msg_type}: this connection already has agent session "
                                f"{self.session_id!r}; send session.close first", event_id)
        if self.phase is Phase.ENDED and msg_type != CLOSING:
            raise ProtocolError("session_ended", f"{msg_type}: agent session {self.session_id!r} has stopped "
                                "(see its error event); send session.close", event_id)

    # -- transitions ------------------------------------------------------------------------------
    def open(self, session_id: str) -> None:
        self._expect(Phase.NO_SESSION)
        self.phase, self.session_id = Phase.ACTIVE, session_id

    def ended(self) -> None:
        """The agent stopped by itself (a no-op unless ACTIVE)."""
        if self.phase is Phase.ACTIVE:
            self.phase = Phase.ENDED

    def closed(self) -> None:
        if self.phase is not Phase.GONE:
            self.phase, self.session_id = Phase.NO_SESSION, None

    def gone(self) -> None:
        self.phase = Phase.GONE

    def _expect(self, phase: Phase) -> None:
        if self.phase is not phase:
            raise RuntimeError(f"agent connection state {self.phase.value}, expected {phase.value}")

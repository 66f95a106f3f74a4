"""Deprecated path: moved to ``execstate.session.runtime.events`` (issue 18); this shim goes in the next release."""

from execstate.session._moved import moved
from execstate.session.runtime.events import (  # noqa: F401
    COMPOSITE,
    MAX_COMPOSITE_PARTS,
    Drained,
    Event,
    EventAck,
    EventId,
    EventKind,
    EventQueue,
    Merge,
    QueueSnapshot,
    SessionEventError,
)

__all__ = [
    "COMPOSITE",
    "Drained",
    "Event",
    "EventAck",
    "EventId",
    "EventKind",
    "EventQueue",
    "MAX_COMPOSITE_PARTS",
    "Merge",
    "QueueSnapshot",
    "SessionEventError",
]

moved("execstate.session.events", "execstate.session.runtime.events")

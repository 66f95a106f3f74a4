"""Client messages that more than one protocol speaks the same way: a session's checkpoints.

``session.checkpoint`` pins the session's state now, ``session.rollback {checkpoint_id}`` returns
to a checkpoint, ``checkpoint.release {checkpoint_id}`` releases one. The LM protocol
(``lm/messages.py``) and the world protocol (``world/messages.py``) put these structs in their
``MessageTable`` as they are; each protocol's handlers decide what the answers look like.
"""

from __future__ import annotations

from execstate.serve.realtime.errors import EventId
from execstate.serve.realtime.messages import Message


class SessionCheckpoint(Message, tag="session.checkpoint"):
    event_id: EventId = None


class SessionRollback(Message, tag="session.rollback"):
    checkpoint_id: str
    event_id: EventId = None


class CheckpointRelease(Message, tag="checkpoint.release"):
    checkpoint_id: str
    event_id: EventId = None

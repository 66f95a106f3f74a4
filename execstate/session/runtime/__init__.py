"""The session runtime: everything that does not depend on a session's kind (docs/contracts.md 6).

- ``lifecycle.py``: ``SessionRuntime``, one session's status machine, step index, event epoch,
  branch id and checkpoints; ``checkpoint.py``: the ``KindState`` contract a kind implements and
  the ``Checkpoint`` of it;
- ``events.py``: the event queue (accepted when queued, applied at a step boundary);
- ``manager.py``: the resident sessions of one owner, their ids, capacity and eviction;
- ``sessions.py``: ``KindSessions``, the operations every kind's sessions object shares;
  ``async_sessions.py``: ``AsyncKindSessions``, the same for an event loop; ``handle.py``: the
  offline handle every kind's session object is;
- ``migration.py`` and ``migration_wire.py``: the kind-agnostic parts of moving a session to
  another instance (the two-phase hand-over, its error, the event queue and signed envelope on
  the wire).

Nothing here imports a kind (``session/lm/``, ``session/world/``). Pure Python except the wire
(msgspec).
"""

"""The world-model session kind: a video world advanced chunk by chunk (docs/world-sessions.md).

- ``events.py`` (its event kinds: ``key``, ``action``, ``camera``, ``prompt``), ``state.py``
  (its ``KindState``: the chunks' K/V blocks in a rolling window, carry, noise generator,
  prompt), ``step.py`` (one chunk in three phases);
- ``sessions.py``: ``WorldSessions``, the sessions of one ``World`` (any thread: a lock);
- ``offline.py`` (``World``, ``WorldSession``) and ``async_world.py`` (``AsyncWorld``, for an
  asyncio server);
- ``migration*.py``: moving a session between ``World``s (its K/V inside one signed message).
"""

"""``AsyncKindSessions``: the asyncio face every session kind shares (what a realtime server calls).

A kind's async front (``AsyncSessions``: ``session/lm/async_sessions.py``; ``AsyncWorld``:
``session/world/async_world.py``) wraps its sessions object (a ``KindSessions``) for an event
loop. The one thing a kind decides is where a bookkeeping call runs, :meth:`AsyncKindSessions.run`:

- LM: ``run(fn)`` sends ``fn(sessions)`` to the engine thread as a command (between two engine
  steps) and awaits its result; the event loop never waits for an engine step;
- world: ``run(fn)`` calls ``fn(sessions)`` at once: it takes the sessions' lock only for its
  bookkeeping (microseconds), never for a chunk's compute.

The operations whose rules are the runtime's are written here once over ``run``: ``close``,
``reset``, ``checkpoint`` (returns the checkpoint's id), ``rollback``, ``release_checkpoint``,
``fork`` (returns the fork's info), ``info`` and ``list``. Checkpoints are referred to by their
ids (strings; anything else is refused ``invalid``). A kind adds ``open``, ``submit_event`` and
``step``, which differ (an LM step streams deltas from the engine; a world step runs a chunk on a
worker thread). Every refusal is ``SessionEventError`` with a ``code``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from execstate.session.runtime.events import SessionEventError
from execstate.session.runtime.sessions import KindSessions

S = TypeVar("S", bound=KindSessions[Any])  # the kind's sessions object
I = TypeVar("I")  # noqa: E741 - the kind's info record
T = TypeVar("T")


def checkpoint_id_of(checkpoint_id: object) -> str:
    """``checkpoint_id`` if it is a string, else ``invalid``."""
    if not isinstance(checkpoint_id, str):
        raise SessionEventError("invalid", f"a checkpoint id is a string, got {checkpoint_id!r}")
    return checkpoint_id


class AsyncKindSessions(ABC, Generic[S, I]):
    """The shared async operations (module docstring) over the kind's :meth:`run`."""

    @abstractmethod
    async def run(self, fn: Callable[[S], T]) -> T:
        """``fn(sessions)`` where the kind serialises its bookkeeping; its result or its error."""

    async def close(self, session_id: str) -> bool:
        """Close (idempotent); a step in flight ends (LM: cancelled; world: discarded once computed)."""
        return await self.run(lambda s: s.close(session_id))

    async def reset(self, session_id: str) -> None:
        await self.run(lambda s: s.reset(session_id))

    async def checkpoint(self, session_id: str) -> str:
        return await self.run(lambda s: s.checkpoint(session_id).checkpoint_id)

    async def rollback(self, session_id: str, checkpoint_id: str) -> None:
        cp = checkpoint_id_of(checkpoint_id)
        await self.run(lambda s: s.rollback(session_id, cp))

    async def release_checkpoint(self, session_id: str, checkpoint_id: str) -> None:
        cp = checkpoint_id_of(checkpoint_id)
        await self.run(lambda s: s.release_checkpoint(session_id, cp))

    async def fork(self, session_id: str, checkpoint_id: str | None = None, new_session_id: str | None = None) -> I:
        cp = None if checkpoint_id is None else checkpoint_id_of(checkpoint_id)
        return await self.run(lambda s: s.info(s.fork(session_id, cp, new_session_id).session_id))

    async def info(self, session_id: str) -> I:
        return await self.run(lambda s: s.info(session_id))

    async def list(self) -> list[I]:
        return await self.run(lambda s: s.list())

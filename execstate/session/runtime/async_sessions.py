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

Ownership: an async front asks as its ``access`` (``session/runtime/access.py``; :data:`LOCAL` by
default). ``scoped(access)`` is a view of the same sessions that asks as ``access``: a server
builds one per caller (per HTTP request from its tenant, per WebSocket connection from the
connection's tenant and kind) and every call of that view resolves ids in the caller's namespace
(``session/runtime/manager.py``). Views share everything but the access.
"""

from __future__ import annotations

import builtins
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from execstate.session.runtime.access import Access
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
    """The shared async operations (module docstring) over the kind's :meth:`run`, as ``access``."""

    access: Access

    @abstractmethod
    async def run(self, fn: Callable[[S], T]) -> T:
        """``fn(sessions)`` where the kind serialises its bookkeeping; its result or its error."""

    @abstractmethod
    def scoped(self, access: Access) -> AsyncKindSessions[S, I]:
        """A view of the same sessions asking as ``access`` (module docstring)."""

    async def close(self, session_id: str) -> bool:
        """Close (idempotent); a step in flight ends (LM: cancelled; world: discarded once computed)."""
        a = self.access
        return await self.run(lambda s: s.close(session_id, a))

    async def reset(self, session_id: str) -> None:
        a = self.access
        await self.run(lambda s: s.reset(session_id, a))

    async def checkpoint(self, session_id: str) -> str:
        a = self.access
        return await self.run(lambda s: s.checkpoint(session_id, a).checkpoint_id)

    async def rollback(self, session_id: str, checkpoint_id: str) -> None:
        cp, a = checkpoint_id_of(checkpoint_id), self.access
        await self.run(lambda s: s.rollback(session_id, cp, a))

    async def release_checkpoint(self, session_id: str, checkpoint_id: str) -> None:
        cp, a = checkpoint_id_of(checkpoint_id), self.access
        await self.run(lambda s: s.release_checkpoint(session_id, cp, a))

    async def fork(self, session_id: str, checkpoint_id: str | None = None, new_session_id: str | None = None) -> I:
        cp, a = (None if checkpoint_id is None else checkpoint_id_of(checkpoint_id)), self.access
        return await self.run(lambda s: s.info(s.fork(session_id, cp, new_session_id, a).session_id, a))

    async def hold(self, session_id: str) -> None:
        """This view's connection kind (``access.holder``) holds the session from now on."""
        a = self.access
        await self.run(lambda s: s.hold(session_id, a))

    async def info(self, session_id: str) -> I:
        a = self.access
        return await self.run(lambda s: s.info(session_id, a))

    async def list(self) -> list[I]:
        a = self.access
        return await self.run(lambda s: s.list(a))

    async def expire_idle(self) -> builtins.list[str]:  # `list` here is the method above
        """Expire the detached sessions idle past the policy's TTL (every owner's); their ids."""
        return await self.run(lambda s: s.expire_idle())

"""``KindSessions``: the operations every session kind's sessions object shares (docs/contracts.md 6).

A kind's sessions object owns the resident sessions of one engine (``LMSessions``,
``session/lm/sessions.py``) or one ``World`` (``WorldSessions``, ``session/world/sessions.py``):
a :class:`SessionManager` (ids, capacity, eviction), the kind's event kinds and its bound on
pending events per session. This base implements, once, every operation whose rules are the
runtime's: ``submit_event``, ``checkpoint``, ``rollback``, ``release_checkpoint``, ``reset``,
``fork``, ``close``, ``close_all``, ``info``, ``list`` and ``runtime``. A kind adds ``open``, its
step, and :meth:`KindSessions.describe` (its info record, built on :func:`runtime_fields`).

Concurrency: every call runs under ``self.lock``, which serialises it with every other call on the
same sessions object; a kind chooses what that lock is (the package docstring says why the two
kinds differ):

- the LM kind passes no lock: its owner thread, the engine thread, is the serialisation point
  (``AsyncSessions`` sends every call there as a command; an offline ``LLM``'s caller is that
  thread), because a session's state (its KV blocks, the request of its step in flight) belongs
  to the engine's scheduler;
- the world kind passes an ``RLock``: any thread may call, and a step's compute runs outside the
  lock on private inputs (``session/world/step.py``).

Ownership: every call takes the caller's :class:`Access` (``session/runtime/access.py``; default
:data:`LOCAL`, offline use) and resolves its session id through the manager within that caller's
namespace, which refuses a session held by a live connection of another kind
(``session_in_use``). A new session (``open``, ``fork``) belongs to the caller's owner.

Refusals are :class:`SessionEventError` with the runtime's codes (``session/runtime/lifecycle.py``,
``session/runtime/manager.py``).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any, Generic, TypeVar

from execstate.session.runtime.access import LOCAL, Access
from execstate.session.runtime.checkpoint import Checkpoint
from execstate.session.runtime.events import EventAck, EventKind, EventQueue
from execstate.session.runtime.lifecycle import ENDED, SessionRuntime, SessionStatus
from execstate.session.runtime.manager import SessionManager

InfoT = TypeVar("InfoT")


def runtime_fields(rt: SessionRuntime) -> dict[str, Any]:
    """The fields every kind's info record has (``SessionInfo``, ``WorldSessionInfo``)."""
    live = rt.status not in ENDED
    checkpoints = [cp.checkpoint_id for cp in rt.checkpoints]
    return {
        "session_id": rt.session_id, "status": rt.status.value, "step_index": rt.step_index,
        "event_epoch": rt.event_epoch, "branch_id": rt.branch_id,
        "checkpoints": checkpoints, "num_checkpoints": len(checkpoints), "last_event_id": rt.events.last_event_id,
        "num_pending_events": rt.events.num_pending, "stepping": rt.status is SessionStatus.STEPPING,
        "error": rt.error, "state_key": rt.state_key().hex() if live else None,
    }


class KindSessions(ABC, Generic[InfoT]):
    """The resident sessions of one kind's owner (module docstring)."""

    def __init__(self, manager: SessionManager, kinds: Mapping[str, EventKind], max_pending_events: int,
                 lock: AbstractContextManager[Any] | None = None) -> None:
        self.manager = manager
        self.kinds = dict(kinds)
        self.max_pending_events = max_pending_events
        self.lock: AbstractContextManager[Any] = lock if lock is not None else contextlib.nullcontext()

    @abstractmethod
    def describe(self, rt: SessionRuntime) -> InfoT:
        """The kind's info record of ``rt`` (called under the lock)."""

    def new_queue(self) -> EventQueue:
        """An empty event queue with this kind's event kinds and bound."""
        return EventQueue(self.kinds, self.max_pending_events)

    # -- events ---------------------------------------------------------------------------------
    def submit_event(self, session_id: str, event_id: int, kind: str, data: Any = None,
                     access: Access = LOCAL) -> EventAck:
        with self.lock:
            return self.manager.get(session_id, access).submit_event(event_id, kind, data)

    # -- checkpoints ------------------------------------------------------------------------------
    def checkpoint(self, session_id: str, access: Access = LOCAL) -> Checkpoint:
        """A checkpoint (``checkpoint_limit`` past the session's bound, ``quota`` past the tenant's)."""
        with self.lock:
            rt = self.manager.get(session_id, access)
            rt.require(SessionStatus.OPEN)
            self.manager.check_quota(rt.owner.tenant, "checkpoints",
                                     lambda: self.manager.tenant_checkpoints(rt.owner.tenant))
            return rt.checkpoint()

    def rollback(self, session_id: str, checkpoint: Checkpoint | str, access: Access = LOCAL) -> None:
        with self.lock:
            rt = self.manager.get(session_id, access)
            rt.rollback(rt.resolve_checkpoint(checkpoint))

    def release_checkpoint(self, session_id: str, checkpoint: Checkpoint | str, access: Access = LOCAL) -> None:
        with self.lock:
            rt = self.manager.get(session_id, access)
            rt.release_checkpoint(checkpoint.checkpoint_id if isinstance(checkpoint, Checkpoint) else checkpoint)

    def reset(self, session_id: str, access: Access = LOCAL) -> None:
        with self.lock:
            self.manager.get(session_id, access).reset()

    def fork(self, session_id: str, checkpoint: Checkpoint | str | None = None,
             new_session_id: str | None = None, access: Access = LOCAL) -> SessionRuntime:
        """A new session (new branch id) from ``checkpoint`` (None: the current state): it shares the
        parent's blocks and has its own generator in the same state, its own events and checkpoints."""
        with self.lock:
            return self.manager.fork(session_id, checkpoint, new_session_id, self.new_queue, access)

    # -- holds and end of life ------------------------------------------------------------------------
    def hold(self, session_id: str, access: Access) -> None:
        """``access.holder`` (a live connection's kind) holds the session from now on."""
        with self.lock:
            self.manager.hold(session_id, access)

    def close(self, session_id: str, access: Access = LOCAL) -> bool:
        """Close (idempotent); True if this call released the session's state."""
        with self.lock:
            return self.manager.close(session_id, access)

    def close_all(self) -> None:
        """Close every resident session (the owner shuts down)."""
        with self.lock:
            for rt in self.manager.resident():
                self.close(rt.session_id, Access(rt.owner, rt.holder))

    def expire_idle(self) -> list[str]:
        """Expire the detached sessions idle past the policy's TTL (``manager.py``); their ids."""
        with self.lock:
            return [rt.session_id for rt in self.manager.expire_idle()]

    # -- queries ------------------------------------------------------------------------------------
    def runtime(self, session_id: str, access: Access = LOCAL) -> SessionRuntime:
        with self.lock:
            return self.manager.get(session_id, access)

    def info(self, session_id: str, access: Access = LOCAL) -> InfoT:
        with self.lock:
            return self.describe(self.manager.get(session_id, access, wake=False))

    def list(self, access: Access = LOCAL) -> list[InfoT]:
        """The caller's owner's resident sessions (those the caller may use: no other holder's)."""
        with self.lock:
            return [self.describe(rt) for rt in self.manager.resident(access.owner)
                    if rt.holder is None or rt.holder == access.holder]

"""One session's lifecycle: status, step index, event epoch, branch id, checkpoints
(docs/contracts.md 6). Pure Python; it does not know what a step computes.

Each session kind (the LM kind: ``session/lm/state.py``; the world-model kind:
``session/world/state.py``) keeps its state in a :class:`KindState`
(``session/runtime/checkpoint.py``; for an LM: tokens, KV blocks, routes, sampling params, RNG;
for a world model: its chunks' K/V blocks, carry, noise generator, prompt). The runtime keeps the
rest and enforces the rules:

Status machine (every other call raises :class:`SessionEventError` with the status's code)::

    OPEN --begin_step--> STEPPING --end_step(ok)--> OPEN        (step_index + 1)
                         STEPPING --end_step(failed)--> FAILED  (never retried in place)
    OPEN | FAILED --reset--> OPEN      (to the newest live checkpoint, else the origin)
    OPEN | FAILED --evict--> EVICTED   (the manager's capacity policy; idle sessions only)
    OPEN | FAILED --expire--> EXPIRED  (detached and idle past the manager's idle TTL)
    OPEN --begin_migration--> MIGRATING --end_migration--> OPEN   (moved elsewhere: then closed)
    OPEN --begin_hibernation--> HIBERNATED --end_hibernation--> OPEN   (woken)
    HIBERNATED --evict | expire--> EVICTED | EXPIRED
    any --close--> CLOSED              (idempotent)

- Calls allowed per status: ``submit_event`` in OPEN and STEPPING (queued for the next
  boundary); ``begin_step``, ``checkpoint``, ``rollback``, ``fork`` in OPEN; ``reset`` in OPEN and
  FAILED; ``close`` always. Refusals: ``busy`` (STEPPING, MIGRATING), ``failed``, ``evicted``,
  ``expired``, ``closed``. While MIGRATING (its state is being sent to another instance,
  ``session/lm/migration_source.py``) every call but ``close`` is refused, so the state sent is the
  state left behind.
- ``step_index`` counts completed steps: the first step is step 1; a checkpoint taken after k
  steps has ``step_index == k`` and rolling back to it re-runs steps k+1, ... .
- ``event_epoch`` advances by one at each boundary that applies at least one event, and on every
  rollback or reset to a fresh value above every epoch the session had, so a state reached after
  a rollback never shares a key with the abandoned branch.
- A checkpoint (:class:`Checkpoint`) holds the kind's saved state (``KindState.save``: pinned
  resources, no copies of tensors) plus the control state: step index, epoch, branch id and the
  event queue's snapshot (pending events, id watermark, acknowledgements). It belongs to the
  session that made it; it is released by ``release_checkpoint`` / ``Checkpoint.release`` or when
  the session closes or is evicted. A fork takes its own references, so it outlives them. A
  session keeps at most ``max_checkpoints`` live checkpoints (None: no bound; the manager sets it):
  one more is refused with ``checkpoint_limit``, changing nothing.
- Ownership (``access.py``): ``owner`` (tenant and realm) is fixed at creation; ``holder`` is the
  kind of live connection that holds the session (None: detached). ``last_used`` is the
  monotonic time of the last call that resolved the session (the manager's idle expiry).
- The *origin* is the state the session started from (empty for a new session, the fork point
  for a fork): ``reset`` returns to it when no checkpoint is live. It is released at close.
- ``close`` (and ``evict``, ``expire``) release the kind state, every checkpoint and the origin,
  exactly once; an ended session keeps only its status (what later calls are refused with).
"""

from __future__ import annotations

import enum
import itertools
import time
from collections.abc import Callable
from typing import Any, TypeVar

from execstate.identity.session_keys import SessionKey, session_state_key
from execstate.session.runtime.access import Owner
from execstate.session.runtime.checkpoint import Checkpoint, KindState
from execstate.session.runtime.events import Drained, EventAck, EventQueue, QueueSnapshot, SessionEventError

T = TypeVar("T")


class SessionStatus(enum.Enum):
    OPEN = "open"
    STEPPING = "stepping"
    FAILED = "failed"
    CLOSED = "closed"
    EVICTED = "evicted"
    EXPIRED = "expired"
    MIGRATING = "migrating"
    HIBERNATED = "hibernated"


ENDED = (SessionStatus.CLOSED, SessionStatus.EVICTED, SessionStatus.EXPIRED)
_REFUSAL = {SessionStatus.STEPPING: "busy", SessionStatus.FAILED: "failed", SessionStatus.CLOSED: "closed",
            SessionStatus.EVICTED: "evicted", SessionStatus.EXPIRED: "expired", SessionStatus.MIGRATING: "busy",
            SessionStatus.HIBERNATED: "hibernated"}


class SessionRuntime:
    """One session's generic state and rules (module docstring). Not thread-safe: its kind's
    sessions object serialises every call (``session/runtime/sessions.py``: the engine thread for
    the LM kind, a lock for the world kind)."""

    def __init__(self, session_id: str, state: KindState, events: EventQueue, branch_id: str,
                 step_index: int = 0, event_epoch: int = 0, max_event_epoch: int | None = None,
                 owner: Owner | None = None, holder: str | None = None) -> None:
        self.session_id = session_id
        self.owner = owner if owner is not None else Owner()
        self.holder = holder
        self.max_checkpoints: int | None = None  # set by the manager (add)
        self.last_used = time.monotonic()
        self.state = state
        self.events = events
        self.branch_id = branch_id
        self.status = SessionStatus.OPEN
        self.step_index = step_index
        self.event_epoch = event_epoch
        # the highest epoch this session (on any instance) had: the next fresh epoch is above it
        self._max_epoch = event_epoch if max_event_epoch is None else max(event_epoch, max_event_epoch)
        self.last_active = 0  # the manager's clock at the last step (LRU eviction)
        self.error: str | None = None  # why the session failed or was evicted
        self.hibernation: Any = None  # the kind's record while HIBERNATED (has release())
        self._checkpoints: dict[str, Checkpoint] = {}
        self._cp_ids = itertools.count(1)
        self.origin = self._save("origin")

    # -- queries --------------------------------------------------------------------------------
    @property
    def checkpoints(self) -> list[Checkpoint]:
        """Live checkpoints, oldest first."""
        return [cp for cp in self._checkpoints.values() if not cp.released]

    def checkpoint_by_id(self, checkpoint_id: str) -> Checkpoint:
        cp = self._checkpoints.get(checkpoint_id)
        if cp is None or cp.released:
            raise SessionEventError("not_found", f"session {self.session_id!r} has no live checkpoint "
                                    f"{checkpoint_id!r}")
        return cp

    def resolve_checkpoint(self, checkpoint: Checkpoint | str) -> Checkpoint:
        """``checkpoint`` itself, or this session's live checkpoint with that id; else ``invalid`` /
        ``not_found``."""
        if isinstance(checkpoint, Checkpoint):
            return checkpoint
        if isinstance(checkpoint, str):
            return self.checkpoint_by_id(checkpoint)
        raise SessionEventError("invalid", f"a checkpoint or its id, got {type(checkpoint).__name__}")

    def state_key(self) -> SessionKey:
        chain, tail = self.state.chain()
        return session_state_key(chain, tail, self.step_index, self.event_epoch, self.branch_id)

    def require(self, *allowed: SessionStatus) -> None:
        """Raise the status's refusal unless the session is in one of ``allowed``."""
        if self.status not in allowed:
            why = f": {self.error}" if self.error else ""
            raise SessionEventError(_REFUSAL.get(self.status, "invalid"),
                                    f"session {self.session_id!r} is {self.status.value}{why}")

    # -- events and steps -------------------------------------------------------------------------
    def submit_event(self, event_id: int, kind: str, data: Any = None) -> EventAck:
        self.require(SessionStatus.OPEN, SessionStatus.STEPPING)
        return self.events.submit(event_id, kind, data)

    def next_event_id(self) -> int:
        """The id a shorthand call uses: one above the watermark."""
        last = self.events.last_event_id
        return 0 if last is None else last + 1

    def begin_step(self, prepare: Callable[[Drained], T]) -> T:
        """Step boundary: drain the pending events and let ``prepare`` start the step with them.
        If ``prepare`` raises, the events are pending again and nothing changed; else the session
        is STEPPING and its epoch advanced if any event was applied."""
        self.require(SessionStatus.OPEN)
        snap = self.events.snapshot()
        drained = self.events.drain()
        try:
            started = prepare(drained)
        except BaseException:
            self.events.restore(snap)
            raise
        if drained.applied or drained.overwritten:
            self._advance_epoch()
        self.status = SessionStatus.STEPPING
        return started

    def end_step(self, ok: bool, error: str | None = None, clock: int = 0) -> None:
        """The step in flight finished: OPEN with the next step index, or FAILED (``error``)."""
        if self.status is not SessionStatus.STEPPING:
            return  # closed while stepping: nothing to advance
        self.last_active = clock
        if ok:
            self.step_index += 1
            self.status = SessionStatus.OPEN
        else:
            self.status = SessionStatus.FAILED
            self.error = error or "the step failed"

    @property
    def max_event_epoch(self) -> int:
        """The highest epoch this session had (a migration carries it along)."""
        return self._max_epoch

    def begin_migration(self) -> None:
        """OPEN -> MIGRATING: every call but ``close`` is refused until ``end_migration``."""
        self.require(SessionStatus.OPEN)
        self.status = SessionStatus.MIGRATING

    def end_migration(self) -> None:
        """MIGRATING -> OPEN (the migration failed, or it succeeded and the caller closes next);
        a session closed meanwhile stays closed."""
        if self.status is SessionStatus.MIGRATING:
            self.status = SessionStatus.OPEN

    def begin_hibernation(self, record: Any) -> None:
        """OPEN -> HIBERNATED, keeping the kind's ``record`` (its state in a tier) until woken."""
        self.require(SessionStatus.OPEN)
        self.status = SessionStatus.HIBERNATED
        self.hibernation = record

    def end_hibernation(self) -> Any:
        """HIBERNATED -> OPEN (woken); returns the kind's record, no longer the runtime's."""
        self.require(SessionStatus.HIBERNATED)
        record, self.hibernation = self.hibernation, None
        self.status = SessionStatus.OPEN
        return record

    def fail(self, code: str, message: str) -> SessionEventError:
        """Move an OPEN session to FAILED (e.g. its state became stale) and return the error to raise."""
        self.require(SessionStatus.OPEN)
        self.status = SessionStatus.FAILED
        self.error = message
        return SessionEventError(code, message)

    # -- checkpoints ------------------------------------------------------------------------------
    @property
    def num_checkpoints(self) -> int:
        return len(self.checkpoints)

    def checkpoint(self) -> Checkpoint:
        self.require(SessionStatus.OPEN)
        for cid in [cid for cid, cp in self._checkpoints.items() if cp.released]:  # released via Checkpoint.release
            del self._checkpoints[cid]
        if self.max_checkpoints is not None and len(self._checkpoints) >= self.max_checkpoints:
            raise SessionEventError("checkpoint_limit", f"session {self.session_id!r} holds {len(self._checkpoints)} "
                                    f"checkpoints, its limit ({self.max_checkpoints}): release one first")
        cp = self._save(f"cp-{next(self._cp_ids)}")
        self._checkpoints[cp.checkpoint_id] = cp
        return cp

    def release_checkpoint(self, checkpoint_id: str) -> None:
        cp = self._checkpoints.pop(checkpoint_id, None)
        if cp is not None:
            cp.release()

    def rollback(self, cp: Checkpoint) -> None:
        self.require(SessionStatus.OPEN)
        self._restore(cp)

    def reset(self) -> None:
        """Back to the newest live checkpoint (the origin if none); also the way out of FAILED."""
        self.require(SessionStatus.OPEN, SessionStatus.FAILED)
        live = self.checkpoints
        self._restore(live[-1] if live else self.origin)
        self.status = SessionStatus.OPEN
        self.error = None

    def fork_parts(self, cp: Checkpoint | None) -> tuple[KindState, QueueSnapshot, int, int]:
        """What a fork at ``cp`` (None: now) starts from: an independent kind state, the event
        queue snapshot, the step index and the epoch. The caller builds the new runtime."""
        self.require(SessionStatus.OPEN)
        if cp is None:
            return self.state.clone(None), self.events.snapshot(), self.step_index, self.event_epoch
        self._check_own(cp)
        return self.state.clone(cp.saved), cp.events, cp.step_index, cp.event_epoch

    # -- end of life ------------------------------------------------------------------------------
    def close(self) -> bool:
        """Release everything (once); True if this call did. Idempotent."""
        return self._end(SessionStatus.CLOSED, None)

    def evict(self, reason: str) -> bool:
        """Release everything and refuse later calls with ``evicted``; only idle sessions."""
        self.require(SessionStatus.OPEN, SessionStatus.FAILED, SessionStatus.HIBERNATED)
        return self._end(SessionStatus.EVICTED, reason)

    def expire(self, reason: str) -> bool:
        """Release everything and refuse later calls with ``expired``; only idle sessions."""
        self.require(SessionStatus.OPEN, SessionStatus.FAILED, SessionStatus.HIBERNATED)
        return self._end(SessionStatus.EXPIRED, reason)

    def _end(self, status: SessionStatus, reason: str | None) -> bool:
        if self.status in ENDED:
            if status is SessionStatus.CLOSED:
                self.status = status  # closing an evicted session: nothing left to release
            return False
        self.status = status
        self.error = reason
        self.holder = None
        self.events.close()
        for cp in self._checkpoints.values():
            cp.release()
        self._checkpoints.clear()
        self.origin.release()
        if self.hibernation is not None:
            record, self.hibernation = self.hibernation, None
            record.release()
        self.state.release()  # a step in flight gives its resources back to a released state: freed then
        return True

    # -- internals --------------------------------------------------------------------------------
    def _save(self, checkpoint_id: str) -> Checkpoint:
        return Checkpoint(checkpoint_id, self.session_id, self.step_index, self.event_epoch, self.branch_id,
                          self.events.snapshot(), self.state.save())

    def _restore(self, cp: Checkpoint) -> None:
        self._check_own(cp)
        self.state.restore(cp.saved)
        self.events.restore(cp.events)
        self.step_index = cp.step_index
        self._advance_epoch()

    def _check_own(self, cp: Checkpoint) -> None:
        if cp.released:
            raise SessionEventError("not_found", f"checkpoint {cp.checkpoint_id!r} was released")
        if cp is not self.origin and self._checkpoints.get(cp.checkpoint_id) is not cp:
            raise SessionEventError("invalid", f"checkpoint {cp.checkpoint_id!r} belongs to session "
                                    f"{cp.session_id!r}, not {self.session_id!r}")

    def _advance_epoch(self) -> None:
        self._max_epoch += 1
        self.event_epoch = self._max_epoch

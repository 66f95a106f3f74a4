"""SessionManager: the resident sessions of one engine, their ids, owners, capacity, quotas, eviction
and idle expiry (docs/contracts.md 6, 8; docs/security.md). Pure Python, independent of the session kind.

- **Ids**: strings of 1 to 128 characters from ``[A-Za-z0-9._:-]``, chosen by the client or
  generated (``sess-`` + 16 hex digits). An id is unique among the resident sessions of one
  *owner* (tenant and realm, ``access.py``): every call resolves an id within the caller's owner
  only, so another tenant's session, or another realm's, is ``not_found``. The id of an ended
  (closed, evicted or expired) session may be reused.
- **Holds**: a session held by a live connection (``SessionRuntime.holder``) refuses a caller
  that is not a holder of the same kind with ``session_in_use``, reads included (:meth:`get`).
  :meth:`hold` makes a caller's connection kind the holder (``session.resume``).
- **Capacity**: at most ``max_sessions`` resident sessions (OPEN, STEPPING, FAILED or MIGRATING;
  forks count). Admitting one more: without an eviction policy (``eviction=None``) the open fails
  with code ``capacity``; with ``eviction="lru"`` the idle session (OPEN or FAILED, never
  STEPPING) whose last step (or open) is the oldest is evicted first, the admitting tenant's own
  before any other's; if none is idle, ``capacity``.
- **Quotas** (``policy.quotas``, per tenant, ``state/quotas.py``): resident sessions of the
  ``sessions`` realm, agents (``agents`` realm) and world sessions (``world``) are checked here on
  admission (code ``quota``); the kinds check checkpoints and pinned KV blocks (``check_quota``).
  What a tenant holds is counted from the resident sessions themselves (:meth:`usage`), never
  kept as a second tally that could drift.
- **Idle expiry** (``policy.idle_ttl_s``; None: never): a *detached* session (no holder) that is
  idle (OPEN or FAILED) and that no call resolved for ``idle_ttl_s`` seconds expires: it releases
  everything and later calls get ``expired``. :meth:`expire_idle` runs on every admission and when
  the owner calls it (a server's periodic sweep).
- **Hibernation** (``policy.hibernate_after_s``; None: never; before ``idle_ttl_s``): a detached,
  OPEN session no call resolved for that long is a candidate (:meth:`to_hibernate`) that the
  kind hibernates (``session/lm/hibernation.py``; a server's sweep). A HIBERNATED session stays
  resident (it counts in its tenant's ``sessions`` quota and in ``max_sessions``) but holds no
  pool blocks; it may be evicted or expire like an idle one. :meth:`get` wakes it through the
  kind's waker (:meth:`set_waker`, installed by the kind's first hibernation) unless the call
  says ``wake=False`` (``info``, ``close``).
- **Checkpoints per session**: at most ``policy.max_checkpoints`` (``checkpoint_limit``).
- **KV pressure**: ``reclaim`` (installed as the engine's block-holds reclaimer by the kind's
  front) evicts the least recently used idle session under the same policy; without a policy it
  evicts nothing.
- An evicted or expired session releases its state and checkpoints at once. Ended sessions are
  remembered (the newest 1024, their state released) so that a call on one says ``closed``,
  ``evicted`` or ``expired`` rather than ``not_found``.
- ``close_all`` closes every resident session (engine shutdown). Every release happens once.
"""

from __future__ import annotations

import itertools
import math
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from execstate.identity.tenant import TenantId
from execstate.session.runtime.access import AGENTS, LOCAL, SESSIONS, WORLD, Access, Owner
from execstate.session.runtime.checkpoint import Checkpoint
from execstate.session.runtime.events import EventQueue, SessionEventError
from execstate.session.runtime.lifecycle import SessionRuntime, SessionStatus
from execstate.state.quotas import QuotaExceeded, QuotaLedger, Quotas

EVICTION_POLICIES = (None, "lru")
SESSION_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")
DEFAULT_MAX_CHECKPOINTS = 64
_REMEMBER_ENDED = 1024
_QUOTA_OF_REALM = {SESSIONS: "sessions", AGENTS: "agents", WORLD: "world_sessions"}
_IDLE = (SessionStatus.OPEN, SessionStatus.FAILED, SessionStatus.HIBERNATED)

Key = tuple[Owner, str]


@dataclass(frozen=True)
class SessionPolicy:
    """Bounds on long-lived state beyond capacity (module docstring): checkpoints per session,
    idle expiry of detached sessions (None: never; offline sessions never expire), per-tenant quotas."""

    max_checkpoints: int | None = DEFAULT_MAX_CHECKPOINTS
    idle_ttl_s: float | None = None
    quotas: Quotas = field(default_factory=Quotas)
    hibernate_after_s: float | None = None

    def __post_init__(self) -> None:
        m = self.max_checkpoints
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise ValueError(f"max_checkpoints must be an int >= 1 or None, got {m!r}")
        t = self.idle_ttl_s
        if t is not None and not (isinstance(t, int | float) and math.isfinite(t) and t > 0):
            raise ValueError(f"idle_ttl_s must be a finite number of seconds > 0 or None, got {t!r}")
        h = self.hibernate_after_s
        if h is not None and not (isinstance(h, int | float) and math.isfinite(h) and h > 0):
            raise ValueError(f"hibernate_after_s must be a finite number of seconds > 0 or None, got {h!r}")
        if h is not None and t is not None and h >= t:
            raise ValueError(f"hibernate_after_s ({h:g}) must be below idle_ttl_s ({t:g}): a session hibernates "
                             "before it expires")


def check_session_id(session_id: object) -> str:
    """``session_id`` if it is a valid id, else SessionEventError ``invalid``."""
    if not isinstance(session_id, str) or not SESSION_ID_RE.fullmatch(session_id):
        raise SessionEventError("invalid", f"a session id is 1-128 characters from [A-Za-z0-9._:-], got {session_id!r}")
    return session_id


def new_session_id() -> str:
    return f"sess-{secrets.token_hex(8)}"


def quota_error(e: QuotaExceeded) -> SessionEventError:
    return SessionEventError("quota", e.message)


class SessionManager:
    def __init__(self, max_sessions: int = 64, eviction: str | None = None, policy: SessionPolicy | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 1:
            raise ValueError(f"max_sessions must be an int >= 1, got {max_sessions!r}")
        if eviction not in EVICTION_POLICIES:
            raise ValueError(f"session eviction must be one of {EVICTION_POLICIES}, got {eviction!r}")
        self.max_sessions = max_sessions
        self.eviction = eviction
        self.policy = policy or SessionPolicy()
        self.quotas = QuotaLedger(self.policy.quotas)
        self.clock = clock
        self._resident: dict[Key, SessionRuntime] = {}
        self._ended: OrderedDict[Key, SessionRuntime] = OrderedDict()
        self._lru = itertools.count(1)
        self.num_evicted = 0
        self.num_expired = 0
        self._waker: Callable[[SessionRuntime], None] | None = None

    # -- queries ---------------------------------------------------------------------------------
    @property
    def num_resident(self) -> int:
        return len(self._resident)

    def resident(self, owner: Owner | None = None) -> list[SessionRuntime]:
        """Resident sessions (of ``owner`` only, when given)."""
        return [rt for rt in self._resident.values() if owner is None or rt.owner == owner]

    def get(self, session_id: str, access: Access = LOCAL, wake: bool = True) -> SessionRuntime:
        """The caller's session (resident or recently ended): ``not_found`` outside its owner's
        namespace, ``session_in_use`` when a live connection of another kind holds it. A
        HIBERNATED session is woken first (the kind's waker) unless ``wake`` is False."""
        rt = self._resident.get((access.owner, session_id)) or self._ended.get((access.owner, session_id))
        if rt is None:
            raise SessionEventError("not_found", f"no session {session_id!r}")
        if rt.holder is not None and rt.holder != access.holder:
            raise SessionEventError("session_in_use", f"session {session_id!r} is held by a live {rt.holder} "
                                    "connection: operate it through that connection")
        rt.last_used = self.clock()
        if wake and rt.status is SessionStatus.HIBERNATED and self._waker is not None:
            self._waker(rt)
        return rt

    def set_waker(self, fn: Callable[[SessionRuntime], None]) -> None:
        """How the kind wakes a HIBERNATED session (engine thread; raises its refusal)."""
        self._waker = fn

    def to_hibernate(self) -> list[SessionRuntime]:
        """Detached OPEN sessions unused for the policy's ``hibernate_after_s`` (none without one)."""
        after = self.policy.hibernate_after_s
        if after is None:
            return []
        now = self.clock()
        return [rt for rt in self._resident.values()
                if rt.holder is None and rt.status is SessionStatus.OPEN and now - rt.last_used >= after]

    def hold(self, session_id: str, access: Access) -> SessionRuntime:
        """Make ``access.holder`` (a connection kind) the holder of the caller's live session."""
        rt = self.get(session_id, access)
        rt.require(SessionStatus.OPEN, SessionStatus.STEPPING, SessionStatus.FAILED)
        rt.holder = access.holder
        return rt

    def tick(self) -> int:
        """The LRU clock's next value (a step ended, a session opened)."""
        return next(self._lru)

    def usage(self) -> dict[TenantId, dict[str, int]]:
        """Per tenant: resident ``sessions``, ``agents`` and ``world_sessions`` (by realm), live
        ``checkpoints`` (every realm) and ``hibernated`` sessions (counted in the others too)."""
        out: dict[TenantId, dict[str, int]] = {}
        for rt in self._resident.values():
            counts = out.setdefault(rt.owner.tenant, {"sessions": 0, "agents": 0, "world_sessions": 0,
                                                      "checkpoints": 0, "hibernated": 0})
            counts["hibernated"] += rt.status is SessionStatus.HIBERNATED
            kind = _QUOTA_OF_REALM.get(rt.owner.realm)
            if kind is not None:
                counts[kind] += 1
            counts["checkpoints"] += rt.num_checkpoints
        return out

    def check_quota(self, tenant: TenantId, kind: str, held: Callable[[], int], asked: int = 1) -> None:
        """``quota`` unless ``tenant`` may hold ``asked`` more ``kind``; ``held()`` is only counted
        when the tenant has a limit on ``kind``."""
        if self.quotas.limits(tenant).limit(kind) is None:
            return
        try:
            self.quotas.check(tenant, kind, held(), asked)
        except QuotaExceeded as e:
            raise quota_error(e) from None

    def tenant_checkpoints(self, tenant: TenantId) -> int:
        return sum(rt.num_checkpoints for rt in self._resident.values() if rt.owner.tenant == tenant)

    # -- admission ---------------------------------------------------------------------------------
    def admit(self, session_id: str | None, access: Access = LOCAL) -> str:
        """Validate (or generate) the id of a session about to open for ``access.owner`` and make
        room for it (expiring idle sessions, evicting under the policy). Raises ``invalid`` (bad
        id, or one resident in the owner's namespace), ``quota`` or ``capacity``; nothing is
        evicted when the id is refused."""
        self.expire_idle()
        owner = access.owner
        sid = new_session_id() if session_id is None else check_session_id(session_id)
        if (owner, sid) in self._resident:
            raise SessionEventError("invalid", f"session id {sid!r} is already open")
        kind = _QUOTA_OF_REALM.get(owner.realm)
        if kind is not None:
            self.check_quota(owner.tenant, kind, lambda: len(self.resident(owner)))
        while len(self._resident) >= self.max_sessions:
            if not self.evict_lru(f"evicted (least recently used) to admit session {sid!r}", owner.tenant):
                raise SessionEventError(
                    "capacity", f"{len(self._resident)} sessions are resident (max_sessions={self.max_sessions})"
                    + ("; none is idle" if self.eviction else "; close one or enable eviction"))
        return sid

    def add(self, rt: SessionRuntime) -> SessionRuntime:
        """Register a session that ``admit`` made room for."""
        key = (rt.owner, rt.session_id)
        if key in self._resident or len(self._resident) >= self.max_sessions:
            raise SessionEventError("capacity", f"no room for session {rt.session_id!r}: call admit first")
        self._ended.pop(key, None)
        rt.last_active = self.tick()
        rt.last_used = self.clock()
        rt.max_checkpoints = self.policy.max_checkpoints
        self._resident[key] = rt
        return rt

    def fork(self, session_id: str, checkpoint: Checkpoint | str | None, new_session_id: str | None,
             new_queue: Callable[[], EventQueue], access: Access = LOCAL) -> SessionRuntime:
        """A new resident session of the same owner (new id, new branch id) from ``checkpoint`` of
        ``session_id`` (None: its current state): the kind's ``fork_parts`` (shared blocks, its own
        generator in the same state), the pending events in a fresh queue (``new_queue``), the
        same step index and epoch; held by the caller's connection kind. The parent is touched
        first, so it is never the LRU victim of its own fork."""
        rt = self.get(session_id, access)
        rt.require(SessionStatus.OPEN)
        cp = None if checkpoint is None else rt.resolve_checkpoint(checkpoint)
        rt.last_active = self.tick()
        sid = self.admit(new_session_id, access)
        state, events, step_index, epoch = rt.fork_parts(cp)
        queue = new_queue()
        queue.restore(events)
        return self.add(SessionRuntime(sid, state, queue, secrets.token_hex(8), step_index, epoch,
                                       owner=rt.owner, holder=access.holder))

    # -- end of life -------------------------------------------------------------------------------
    def close(self, session_id: str, access: Access = LOCAL) -> bool:
        """Close a session (idempotent; closing an unknown id raises ``not_found``); a hibernated
        one is not woken."""
        rt = self.get(session_id, access, wake=False)
        released = rt.close()
        self._forget(rt)
        return released

    def lose(self, rt: SessionRuntime, reason: str) -> None:
        """The session's state is lost (a hibernated session whose stored state failed its checks
        and cannot be rebuilt): it is evicted with ``reason``, releasing what it held."""
        rt.evict(reason)
        self.num_evicted += 1
        self._forget(rt)

    def evict_lru(self, reason: str, tenant: TenantId | None = None, holding_kv: bool = False) -> bool:
        """Evict the least recently used idle session under the policy (``tenant``'s own first;
        ``holding_kv``: not a hibernated one, which holds no pool blocks); False if none may go."""
        if self.eviction != "lru":
            return False
        idle = [rt for rt in self._resident.values() if rt.status in _IDLE
                and not (holding_kv and rt.status is SessionStatus.HIBERNATED)]
        own = [rt for rt in idle if rt.owner.tenant == tenant]
        if not (own or idle):
            return False
        victim = min(own or idle, key=lambda rt: rt.last_active)
        victim.evict(reason)
        self.num_evicted += 1
        self._forget(victim)
        return True

    def reclaim(self) -> bool:
        """KV pressure (the engine's block holds): evict one idle session under the policy."""
        return self.evict_lru("evicted (least recently used) under KV cache pressure", holding_kv=True)

    def expire_idle(self) -> list[SessionRuntime]:
        """Expire every detached, idle session unused for the policy's ``idle_ttl_s``; returns them."""
        ttl = self.policy.idle_ttl_s
        if ttl is None:
            return []
        now = self.clock()
        gone = [rt for rt in self._resident.values()
                if rt.holder is None and rt.status in _IDLE and now - rt.last_used >= ttl]
        for rt in gone:
            rt.expire(f"expired: detached and unused for {ttl:g} s (--session-idle-ttl)")
            self.num_expired += 1
            self._forget(rt)
        return gone

    def close_all(self) -> None:
        for rt in list(self._resident.values()):
            rt.close()
            self._forget(rt)

    def _forget(self, rt: SessionRuntime) -> None:
        key = (rt.owner, rt.session_id)
        if self._resident.get(key) is rt:
            del self._resident[key]
        self._ended[key] = rt
        self._ended.move_to_end(key)
        while len(self._ended) > _REMEMBER_ENDED:
            self._ended.popitem(last=False)

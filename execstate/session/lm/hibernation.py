"""LM session hibernation: sleep in the tiers, wake here or on another engine (docs/offload.md
"Hibernation"; docs/offload.md). Engine thread only (an offline ``LLM``'s caller is that thread),
except :meth:`Hibernated.publish`, which any thread may call. The public API::

    s.hibernate(); s.wake()                         # offline Session (session/lm/offline.py)
    await sessions.hibernate(sid); await sessions.wake(sid)      # AsyncSessions
    POST /v1/sessions/{id}/hibernate, POST /v1/sessions/{id}/wake # serve/sessions/hibernation.py
    record = hibernate(lm_sessions, sid, access)    # this module; record.publish() (any thread)
    ref = reference(lm_sessions, sid, access, target_engine_id)   # signed, for another engine
    rt = wake_from_reference(other_lm_sessions, ref, ledger)      # hibernation_import.py

**Hibernate** (:func:`hibernate`, an OPEN session of the caller's; idempotent): its full blocks,
and those of its checkpoints and origin, are written to the offload tiers as units under their
execution-state keys (``OffloadConnector.store_units``: KV, route rows, record), its control state
is encoded as a manifest (``hibernation_wire.py``: signed with the offload tiers' ring, shared or per-process)
and every pool block it pins is released; it is HIBERNATED (``session/runtime/lifecycle.py``). It
still counts in its tenant's ``sessions`` quota and ``max_sessions``; it holds no pool block.
:meth:`Hibernated.publish` then waits for its units to be written and puts the manifest in the
shared tier (Redis: ``state/tiers/manifest_store.py``) when there is one and a secret signs it.

**Wake** (transparent: the next call that resolves the session, through the manager's waker,
which the first hibernation installs; or :func:`wake`): a published manifest is claimed first (an
atomic delete in Redis: ``closed`` when another engine claimed it, ``unavailable`` while Redis
cannot be reached, the session staying asleep); then the manifest is decoded, verified and turned
back into the session's state (``hibernation_state.py``), whose session state key must be the one
recorded at hibernation (a stale step index, event epoch or other tokens are detected before
use: the session is FAILED with ``desync``; ``reset`` or ``close``). The KV is not loaded here:
the next step's request takes the pool's cached blocks, reloads the rest from the tiers
(verified, asynchronously) and recomputes what no tier has; its tokens and routes are those of a
session that never slept. Checkpoints stay (their blocks reload or recompute the same way).

Without any offload tier a hibernation keeps the manifest in memory and its next step recomputes
the context (with prefix-cache hits).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from dataclasses import dataclass, field

from execstate.identity.execution import ExecutionIdentity
from execstate.identity.keys import BlockKey
from execstate.identity.session_keys import SessionKey
from execstate.session.lm.hibernation_state import block_units, desync, state_from_manifest
from execstate.session.lm.hibernation_wire import (
    FORMAT_VERSION,
    HibernationManifest,
    HibernationReference,
    decode_manifest,
    digest,
    encode_manifest,
    encode_reference,
)
from execstate.session.lm.migration_state import build_offer
from execstate.session.lm.sessions import LMSessions
from execstate.session.lm.state import LMSaved, LMState
from execstate.session.runtime.access import LOCAL, Access
from execstate.session.runtime.events import SessionEventError
from execstate.session.runtime.lifecycle import SessionRuntime, SessionStatus
from execstate.session.runtime.migration import MigrationError
from execstate.state.tiers.manifest_store import ManifestStore, ManifestUnavailable

MANIFEST_TTL_S = 7 * 24 * 3600.0  # a published manifest's life in the shared tier
REFERENCE_TTL_S = 300.0
logger = logging.getLogger("execstate.offload")


@dataclass(eq=False)
class Hibernated:
    """A hibernated session's record (``SessionRuntime.hibernation``). ``nbytes``: the manifest's
    bytes plus its units' KV bytes (``/metrics``)."""

    session_id: str
    manifest: bytes
    digest: bytes
    state_key: SessionKey
    unit_keys: tuple[BlockKey, ...]
    nbytes: int
    shareable: bool  # signed with the instances' shared ring (not a per-process key): may be published
    manifests: ManifestStore | None = None
    manifest_key: str | None = None
    published: bool = False
    withdrawn: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def publish(self, flush: object = None) -> bool:
        """Put the manifest in the shared tier (any thread), after ``flush()`` (the units' writes);
        False when there is none, it is not signed with the shared ring, the session woke meanwhile, or
        Redis failed."""
        if self.manifests is None or self.manifest_key is None or not self.shareable:
            return False
        if callable(flush):
            flush()
        with self._lock:
            if self.withdrawn:
                return False
            try:
                self.manifests.put(self.manifest_key, self.manifest, MANIFEST_TTL_S)
            except ManifestUnavailable as e:
                logger.warning("hibernated session %r stays local: the shared tier failed (%s)", self.session_id, e)
                return False
            self.published = True
            return True

    def withdraw(self) -> bool:
        """No publish from now on; whether the manifest was published (then the waker claims it)."""
        with self._lock:
            self.withdrawn = True
            return self.published

    def release(self) -> None:
        """The session ended asleep: its published manifest is deleted (no engine can wake it)."""
        if self.withdraw() and self.manifests is not None and self.manifest_key is not None:
            with contextlib.suppress(ManifestUnavailable):
                self.manifests.claim(self.manifest_key)
            self.published = False


def hibernate(sessions: LMSessions, session_id: str, access: Access = LOCAL) -> Hibernated:
    """Put the caller's session to sleep (module docstring); its record (publish it next)."""
    rt = sessions.manager.get(session_id, access, wake=False)
    if rt.status is SessionStatus.HIBERNATED:
        return rt.hibernation
    rt.require(SessionStatus.OPEN)
    state = rt.state
    assert isinstance(state, LMState)
    engine = sessions.engine
    current = sessions.port.identity(state.identity.scope)
    if state.token_ids and state.identity != current:
        raise SessionEventError("stale_state", f"session {session_id!r} was computed under other weights or "
                                "provenance; reset and step with reprefill=True first")
    bs = engine.block_size
    rows = state.routes.rows(0, state.routes.rows_known) if state.routes is not None else None

    def version(identity: ExecutionIdentity) -> str | None:  # named in the units' records (their KV events)
        return engine.provenance.weights_version if identity == current else None

    own = block_units(state.token_ids, state.identity, state.blocks, rows, bs, version(state.identity))
    saved = [cp.saved for cp in [*rt.checkpoints, rt.origin] if isinstance(cp.saved, LMSaved) and not cp.released]
    units = {u.key: u for s in saved
             for u in block_units(s.token_ids, s.identity, s.blocks, s.routes, bs, version(s.identity))}
    units.update({u.key: u for u in own})
    stored = sessions.port.store_units(list(units.values()))
    conn = engine.offload
    eid = sessions.port.engine_id
    offer = build_offer(rt, source_instance_id=eid, provenance_digest=engine.provenance.digest(), handoff=None,
                        commit_by=time.time() + MANIFEST_TTL_S, nonce=secrets.token_hex(16), target_engine_id=eid)
    keys = tuple(u[1] for u in own)
    key = rt.state_key()
    ring = conn.ring if conn is not None else None  # the shared ring, else this process's own key
    data = encode_manifest(HibernationManifest(FORMAT_VERSION, eid, offer, [bytes(k) for k in keys], bytes(key),
                                               time.time()), ring)
    state.drop_kv()
    for s in saved:
        s.drop_kv()
    record = Hibernated(rt.session_id, data, digest(data), key, keys,
                        len(data) + stored * (conn.unit_nbytes if conn is not None else 0),
                        conn is not None and conn.shared_ring is not None)
    if conn is not None and conn.manifests is not None:
        record.manifests = conn.manifests
        record.manifest_key = conn.manifests.manifest_key(eid, rt.owner.tenant, rt.session_id)
    rt.begin_hibernation(record)
    sessions.manager.set_waker(lambda r: wake_runtime(sessions, r))
    return record


def hibernate_idle(sessions: LMSessions) -> list[Hibernated]:
    """Hibernate every session idle past the policy's ``hibernate_after_s`` (a server's sweep)."""
    out = []
    for rt in sessions.manager.to_hibernate():
        with contextlib.suppress(SessionEventError):
            out.append(hibernate(sessions, rt.session_id, Access(rt.owner, rt.holder)))
    return out


def wake(sessions: LMSessions, session_id: str, access: Access = LOCAL) -> SessionRuntime:
    """Wake the caller's session now (a no-op when it is awake)."""
    rt = sessions.manager.get(session_id, access, wake=False)
    if rt.status is SessionStatus.HIBERNATED:
        wake_runtime(sessions, rt)
    return rt


def wake_runtime(sessions: LMSessions, rt: SessionRuntime) -> None:
    """The manager's waker (module docstring: claim, verify, rebuild)."""
    record = rt.hibernation
    assert isinstance(record, Hibernated)
    if record.withdraw():
        assert record.manifests is not None and record.manifest_key is not None
        try:
            mine = record.manifests.claim(record.manifest_key)
        except ManifestUnavailable as e:
            record.withdrawn = False
            raise SessionEventError("unavailable", f"session {rt.session_id!r} sleeps in the shared tier, which "
                                    f"cannot be reached now ({e}); try again") from None
        record.published = False
        if not mine:
            sessions.manager.close(rt.session_id, Access(rt.owner, rt.holder))
            raise SessionEventError("closed", f"session {rt.session_id!r} was woken on another engine from the "
                                    "shared tier")
    conn = sessions.engine.offload
    ring = conn.ring if conn is not None else None
    try:
        if digest(record.manifest) != record.digest:
            raise desync("its manifest changed since it was written")
        m = decode_manifest(record.manifest, ring, require_signature=ring is not None)
        if m.offer.session_id != rt.session_id or m.offer.tenant != rt.owner.tenant:
            raise desync("the manifest names another session or tenant")
        state, _ = state_from_manifest(sessions.engine, sessions.port, m, sessions.kinds, sessions.max_pending_events,
                                       sessions.sharing)
        if bytes(m.state_key) != bytes(record.state_key):
            raise desync("a stale manifest (its step index, event epoch, branch or tokens are not the session's)")
    except MigrationError as e:
        rt.end_hibernation()
        raise rt.fail(e.code, f"session {rt.session_id!r} could not wake: {e.message}; reset or close it") from None
    old = rt.state
    rt.state = state
    old.release()
    rt.end_hibernation()


def reference(sessions: LMSessions, session_id: str, access: Access, target_engine_id: str,
              ttl_s: float = REFERENCE_TTL_S) -> bytes:
    """A signed reference to the caller's hibernated, published session, for ``target_engine_id``
    (``hibernation_import.wake_from_reference``); ``unsupported`` when it is not in a shared tier."""
    rt = sessions.manager.get(session_id, access, wake=False)
    record = rt.hibernation
    if rt.status is not SessionStatus.HIBERNATED or not isinstance(record, Hibernated):
        raise SessionEventError("invalid", f"session {session_id!r} is not hibernated")
    conn = sessions.engine.offload
    if not record.published or record.manifest_key is None or conn is None or conn.shared_ring is None:
        raise SessionEventError("unsupported", f"session {session_id!r} is not in a shared tier (it needs "
                                "--offload-redis-url and the instances' shared secret)")
    if not 0 < ttl_s <= 3600:
        raise SessionEventError("invalid", f"ttl_s must be in (0, 3600], got {ttl_s!r}")
    ref = HibernationReference(FORMAT_VERSION, record.manifest_key, rt.session_id, rt.owner.tenant, target_engine_id,
                               secrets.token_hex(16), time.time() + ttl_s, record.digest, bytes(record.state_key))
    return encode_reference(ref, conn.shared_ring)

"""Copies of live LM sessions in the shared tier, so that another engine can resume them if this
one is lost (docs/fleet.md "A replica lost"; docs/offload.md; docs/fleet.md). A fleet's replicas run it.

A *copy* is what a hibernation writes (``session/lm/hibernation.py``: the session's full blocks
as units under their execution-state keys, its control state as a signed manifest under
``ManifestStore.manifest_key(engine id, tenant, session id)`` in Redis), **without** putting
the session to sleep: it stays OPEN and keeps its pool blocks. Any engine holding the shared
secret wakes the copy from a signed reference (``hibernation_import.make_reference`` +
``wake_from_reference``), continuing from the copy's step: the steps the session took after its
last copy are what a lost engine loses.

:class:`SharedCopies` keeps one engine's copies current. Call order, repeated (a replica's copy
loop, every ``copy_every_s``):

1. :meth:`SharedCopies.due` on the **engine thread**: builds a copy of every OPEN session whose
   session state key changed since its last copy (a step, an event, a rollback) or whose copy was
   found gone (a hibernation's wake claims the manifest key), submitting its new units to the
   tiers' write-back; lists the copies of sessions no longer here (closed, expired, migrated
   away) to delete. A HIBERNATED session's manifest is its copy (nothing built); a STEPPING or
   MIGRATING one is copied at a later sweep; one held by a live connection (a realtime socket:
   it ends with its connection) is not copied.
2. :meth:`SharedCopies.publish` on **any other thread**: waits for the units' writes (``flush``),
   puts each new manifest, deletes the stale ones, and checks (one pipelined ``EXISTS``) that the
   unchanged copies are still there; a missing one is rebuilt at the next sweep.

At most one server serves a session: the copy of a live session is only ever woken by a holder
of the shared secret that knows the engine is gone (the fleet's ingress, once Ray reports the
replica's actor dead), and the wake is the atomic claim of the manifest key, so of any number of
engines trying, one wins. A copy is deleted when its session ends here, so a closed session is
never resumed. Failures (Redis unreachable) are logged and retried at the next sweep: a copy
can be older than ``copy_every_s``, never wrong (a copy is verified like a hibernated manifest).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from execstate.identity.session_keys import SessionKey
from execstate.session.lm.hibernation import MANIFEST_TTL_S
from execstate.session.lm.hibernation_state import block_units
from execstate.session.lm.hibernation_wire import FORMAT_VERSION, HibernationManifest, encode_manifest
from execstate.session.lm.migration_state import build_offer
from execstate.session.lm.sessions import LMSessions
from execstate.session.lm.state import LMState
from execstate.session.runtime.access import Owner
from execstate.session.runtime.lifecycle import SessionRuntime, SessionStatus
from execstate.state.tiers.manifest_store import ManifestStore, ManifestUnavailable

logger = logging.getLogger("execstate.offload")


@dataclass(frozen=True)
class SharedCopy:
    """One built copy: its manifest (signed), under ``manifest_key``, of the session's state at
    ``step_index`` (state key ``state_key``)."""

    session_id: str
    tenant: str
    manifest_key: str
    step_index: int
    state_key: SessionKey
    manifest: bytes


@dataclass
class CopySweep:
    """What one :meth:`SharedCopies.due` found: copies to put, keys to delete, keys to check."""

    put: list[SharedCopy]
    delete: list[str]
    check: list[tuple[tuple[Owner, str], str]]
    flush: Callable[[], object] | None
    manifests: ManifestStore | None  # the shared tier's manifests (``publish`` writes there), if any


def build_copy(sessions: LMSessions, rt: SessionRuntime) -> SharedCopy:
    """A copy of the OPEN session ``rt`` (engine thread; module docstring): its units submitted
    to the tiers, its manifest signed. The session keeps its blocks and stays OPEN."""
    rt.require(SessionStatus.OPEN)
    state = rt.state
    assert isinstance(state, LMState)
    engine = sessions.engine
    conn = engine.offload
    if conn is None or conn.manifests is None or conn.shared_ring is None:
        raise ValueError("a shared copy needs a Redis tier (offload_redis_url) and the shared secret")
    rows = state.routes.rows(0, state.routes.rows_known) if state.routes is not None else None
    own = block_units(state.token_ids, state.identity, state.blocks, rows, engine.block_size)
    sessions.port.store_units(own)
    eid = sessions.port.engine_id
    offer = build_offer(rt, source_instance_id=eid, provenance_digest=engine.provenance.digest(), handoff=None,
                        commit_by=time.time() + MANIFEST_TTL_S, nonce=secrets.token_hex(16), target_engine_id=eid)
    key = rt.state_key()
    data = encode_manifest(HibernationManifest(FORMAT_VERSION, eid, offer, [bytes(u[1]) for u in own], bytes(key),
                                               time.time()), conn.shared_ring)
    return SharedCopy(rt.session_id, str(rt.owner.tenant), conn.manifests.manifest_key(eid, rt.owner.tenant,
                      rt.session_id), rt.step_index, key, data)


class SharedCopies:
    """The copies of one engine's live sessions (module docstring). Not thread-safe by itself:
    :meth:`due` runs on the engine thread, :meth:`publish` on one other thread, in turn."""

    def __init__(self) -> None:
        self._copied: dict[tuple[Owner, str], tuple[SessionKey, str]] = {}  # session -> (state key, manifest key)
        self.built = 0  # copies built (metrics, tests)
        self.last: dict[str, int] = {}  # session id -> the step index of its last published copy

    def due(self, sessions: LMSessions) -> CopySweep:
        """Engine thread: build what changed, list what to delete and check (module docstring)."""
        conn = sessions.engine.offload
        if conn is None or conn.manifests is None or conn.shared_ring is None:
            return CopySweep([], [], [], None, conn.manifests if conn is not None else None)
        here: set[tuple[Owner, str]] = set()
        put: list[SharedCopy] = []
        check: list[tuple[tuple[Owner, str], str]] = []
        for rt in sessions.manager.resident():
            sid = (rt.owner, rt.session_id)
            here.add(sid)
            if rt.status is SessionStatus.HIBERNATED:
                self._copied.pop(sid, None)  # its manifest is the copy; copied again once it wakes
                continue
            if rt.status is not SessionStatus.OPEN or rt.holder is not None or not isinstance(rt.state, LMState):
                continue  # busy, ended, or operated through a live connection (which ends with it)
            known = self._copied.get(sid)
            if known is not None and bytes(known[0]) == bytes(rt.state_key()):
                check.append((sid, known[1]))
                continue
            copy = build_copy(sessions, rt)
            self._copied[sid] = (copy.state_key, copy.manifest_key)
            put.append(copy)
            self.built += 1
        gone = [sid for sid in self._copied if sid not in here]
        delete = [self._copied.pop(sid)[1] for sid in gone]
        return CopySweep(put, delete, check, conn.flush, conn.manifests)

    def publish(self, sweep: CopySweep, manifests: ManifestStore) -> int:
        """Any thread but the engine's: write the sweep's copies (after their units), delete the
        stale ones, forget the copies found gone (rebuilt next time). How many were put."""
        put = 0
        try:
            if sweep.put and sweep.flush is not None:
                sweep.flush()
            for c in sweep.put:
                manifests.put(c.manifest_key, c.manifest, MANIFEST_TTL_S)
                self.last[c.session_id] = c.step_index
                put += 1
            for key in sweep.delete:
                manifests.claim(key)
            present = manifests.exists([key for _, key in sweep.check])
        except ManifestUnavailable as e:
            logger.warning("shared copies not written (%s); retried at the next sweep", e)
            for c in sweep.put[put:]:
                self._forget(c.manifest_key)
            return put
        for (sid, key), there in zip(sweep.check, present, strict=True):
            if not there and self._copied.get(sid, (None, None))[1] == key:
                del self._copied[sid]
        return put

    def _forget(self, manifest_key: str) -> None:
        for sid, (_, key) in list(self._copied.items()):
            if key == manifest_key:
                del self._copied[sid]

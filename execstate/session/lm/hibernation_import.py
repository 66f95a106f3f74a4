"""Wake a session hibernated by another engine, from the shared tier (docs/offload.md
"Hibernation"; docs/security.md; docs/offload.md). Engine thread only.

:func:`wake_from_reference` takes this engine's ``LMSessions`` and a signed
:class:`~execstate.session.lm.hibernation_wire.HibernationReference` (made by the engine that
hibernated the session: ``hibernation.reference``, ``POST /v1/sessions/{id}/hibernate`` with a
``target_engine_id``; or by anyone holding the instances' shared secret, e.g. a fleet resuming a
lost replica's sessions: :func:`make_reference`) and, in this order, before anything is created:

1. the reference's signature (always required: ``unauthorized``), that it is for this engine
   (``wrong_target``), not expired (``expired``), and its nonce unseen (``replay``, with a
   ``HandoverLedger``);
2. the manifest from Redis (``not_found`` when absent: woken elsewhere, closed, or expired;
   ``unavailable`` when Redis cannot be reached), its digest equal to the reference's (a stale or
   replaced manifest is ``desync``), its signature, its session id and tenant equal to the
   reference's, its state key equal to the reference's (a stale step index or event epoch);
3. its contents against this engine (``hibernation_state.state_from_manifest``: provenance,
   bounds, unit keys, state key), the id in the tenant's namespace (``conflict``), the tenant's
   ``sessions`` quota and the capacity;
4. the **claim**: the manifest's key is deleted in Redis, atomically; only the engine whose delete
   removed it creates the session (``conflict`` otherwise). That single step is the hand-over: the
   engine that hibernated the session claims it the same way before it serves it again
   (``hibernation.wake_runtime``), so at most one engine ever serves it.

Then the session is created here under the manifest's tenant with its id, branch id, step index,
epochs, RNG state, sampling parameters, priority, pending events and acknowledgements (OPEN,
no checkpoints: they stay with the engine that hibernated it, as in a migration), its units are
made known to the Redis tier's index, and its next step reloads them (verified) or recomputes.
"""

from __future__ import annotations

import secrets
import time

from execstate.identity.keys import BlockKey
from execstate.identity.secret_ring import SecretRing
from execstate.identity.tenant import TenantId
from execstate.session.lm.hibernation_state import desync, state_from_manifest
from execstate.session.lm.hibernation_wire import (
    FORMAT_VERSION,
    HibernationReference,
    decode_manifest,
    decode_reference,
    digest,
    encode_reference,
)
from execstate.session.lm.migration_state import offer_owner
from execstate.session.lm.sessions import LMSessions
from execstate.session.runtime.access import Access
from execstate.session.runtime.events import SessionEventError
from execstate.session.runtime.lifecycle import SessionRuntime
from execstate.session.runtime.migration import MigrationError
from execstate.state.tiers.manifest_store import ManifestUnavailable
from execstate.transfer.handover import HandoverError, HandoverLedger


def make_reference(secret: SecretRing, manifest_key: str, session_id: str, tenant: TenantId | str,
                   target_engine_id: str, ttl_s: float = 300.0) -> bytes:
    """A reference to the manifest under ``manifest_key`` (``ManifestStore.manifest_key(source
    engine id, tenant, session id)``) without its digest or state key: for a holder of the shared
    secret resuming the sessions of an engine that is gone."""
    ref = HibernationReference(FORMAT_VERSION, manifest_key, session_id, str(tenant), target_engine_id,
                               secrets.token_hex(16), time.time() + ttl_s)
    return encode_reference(ref, secret)


def wake_from_reference(sessions: LMSessions, data: bytes, ledger: HandoverLedger | None = None) -> SessionRuntime:
    """Create, on this engine, the session ``data`` (a signed reference) points to (module
    docstring); ``MigrationError`` with nothing created when refused."""
    engine = sessions.engine
    conn = engine.offload
    if conn is None or conn.manifests is None:
        raise MigrationError("unsupported", "this engine has no shared tier (--offload-redis-url)")
    ref = decode_reference(data, conn.shared_ring)
    if ref.target_engine_id != sessions.port.engine_id:
        raise MigrationError("wrong_target", f"the reference is for engine {ref.target_engine_id!r}, not this one")
    if ref.expires_at <= time.time():
        raise MigrationError("expired", "the reference expired")
    if ledger is not None:
        try:
            ledger.admit(ref.nonce, ref.expires_at)
        except HandoverError as e:
            raise MigrationError(e.code, e.message) from None
    try:
        blob = conn.manifests.get(ref.manifest_key)
    except ManifestUnavailable as e:
        raise MigrationError("unavailable", f"the shared tier cannot be reached: {e}") from None
    if blob is None:
        raise MigrationError("not_found", f"no hibernated session {ref.session_id!r} in the shared tier (woken "
                             "elsewhere, closed or expired)")
    if ref.manifest_digest is not None and digest(blob) != ref.manifest_digest:
        raise desync("the stored manifest is not the one referenced (stale or replaced)")
    m = decode_manifest(blob, conn.shared_ring, require_signature=True)
    offer = m.offer
    if offer.session_id != ref.session_id or offer.tenant != ref.tenant:
        raise desync("the manifest names another session or tenant than the reference")
    if ref.state_key is not None and bytes(m.state_key) != ref.state_key:
        raise desync("a stale manifest (its step index, event epoch, branch or tokens are not the referenced state)")
    state, queue = state_from_manifest(engine, sessions.port, m, sessions.kinds, sessions.max_pending_events,
                                       sessions.sharing)
    owner = offer_owner(offer)
    manager = sessions.manager
    if any(rt.session_id == offer.session_id for rt in manager.resident(owner)):
        raise MigrationError("conflict", f"session {offer.session_id!r} is already open on this engine")
    try:
        manager.check_quota(owner.tenant, "sessions", lambda: len(manager.resident(owner)))
        sid = manager.admit(offer.session_id, Access(owner))
    except SessionEventError as e:
        raise MigrationError(e.code, e.message) from None
    try:
        mine = conn.manifests.claim(ref.manifest_key)
    except ManifestUnavailable as e:
        raise MigrationError("unavailable", f"the shared tier cannot be reached: {e}") from None
    if not mine:
        raise MigrationError("conflict", f"session {offer.session_id!r} was woken by another engine meanwhile")
    conn.adopt_shared([BlockKey(k) for k in m.unit_keys])  # checked against the session's keys
    rt = SessionRuntime(sid, state, queue, offer.branch_id, offer.step_index, offer.event_epoch,
                        offer.max_event_epoch, owner=owner)
    return manager.add(rt)

"""The source side of a session migration (docs/contracts.md 5, 6): engine thread only.

Call order (the runtime's hand-over, ``session/runtime/migration.py``): :func:`begin_export` ->
the offer goes to the target (in-process, or over HTTP) -> :func:`finish_export` with ``ok`` =
whether the target acknowledged that it imported the session (not yet serving it: the caller
commits it there next). Both take the engine's ``LMSessions`` (the session's owner;
``sessions.engine`` is the engine). The offer is bound to one target (``target_engine_id``) and
one ``nonce``, and signed with the shared secret: an engine without one cannot send sessions.

- ``begin_export`` refuses a session that is not OPEN (``busy`` while it steps or migrates,
  ``failed``, ``closed``, ...) or whose state was computed under another provenance
  (``stale_state``), and an engine without an exporting PD connector (``unsupported``). Then the
  session becomes MIGRATING (every call but ``close`` is refused, so it cannot change while its
  state travels), its full KV blocks are exported through the PD connector's ``KVExporter``
  (pinned, checksummed, with keys and route records, until the target releases them or the TTL)
  and its control state is encoded and signed (``session/lm/migration_wire.py``). The session is
  the caller's (``access``: another tenant's is ``not_found``).
- ``finish_export(ok=True)``: the target has the session; the source closes its own, releasing
  its blocks, its checkpoints and its origin (checkpoints are not migrated: they stay behind and
  end with the source session). ``ok=False``: the session is OPEN again, exactly as it was, and
  serves the next step; the export's pins are dropped at once in both cases (a target that did
  not get the manifest yet then fails closed with ``released``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from execstate.session.lm.migration_state import build_offer
from execstate.session.lm.migration_wire import encode_offer
from execstate.session.lm.sessions import LMSessions
from execstate.session.lm.state import LMState
from execstate.session.runtime.access import LOCAL, Access
from execstate.session.runtime.events import SessionEventError
from execstate.session.runtime.lifecycle import SessionRuntime, SessionStatus
from execstate.session.runtime.migration import MigrationError
from execstate.transfer.errors import TransferError


@dataclass(frozen=True)
class Outgoing:
    """A migration in progress at the source. ``payload``: the signed offer's bytes."""

    session_id: str
    nonce: str
    target_engine_id: str
    payload: bytes
    transfer_id: str | None
    num_blocks: int  # full blocks exported
    num_tokens: int
    commit_by: float  # Unix time: the target may not create the session after it
    checkpoints_left: int  # checkpoints that stay behind (released with the source session)
    started: float  # time.monotonic() at begin_export
    runtime: SessionRuntime | None = field(default=None, repr=False, compare=False)  # engine thread only


def exportable(sessions: LMSessions, session_id: str, access: Access = LOCAL) -> SessionRuntime:
    """The caller's session, OPEN, or ``MigrationError`` with the session's own code (``not_found`` for
    another tenant's or an unknown id, ``busy``, ``expired``, ...). Nothing changes: the sending side
    calls it before it contacts anyone, and ``begin_export`` again before it freezes the session."""
    try:
        rt = sessions.manager.get(session_id, access)
        rt.require(SessionStatus.OPEN)
    except SessionEventError as e:  # not_found, busy, failed, closed, evicted: the session's own code
        raise MigrationError(e.code, e.message) from None
    return rt


def begin_export(sessions: LMSessions, session_id: str, window_s: float, *, target_engine_id: str, nonce: str,
                 access: Access = LOCAL) -> Outgoing:
    """Freeze the session, export its blocks and encode its offer for ``target_engine_id`` under
    ``nonce`` (module docstring). Raises ``MigrationError`` (with the session's own code when it
    refuses) with nothing changed."""
    if window_s <= 0 or not window_s < 3600:
        raise MigrationError("invalid", f"the migration window must be in (0, 3600) seconds, got {window_s!r}")
    engine = sessions.engine
    pd = engine.pd
    if pd is None or not pd.exports:
        raise MigrationError("unsupported", "this instance cannot send sessions: it needs a PD connector with "
                             "role kv_producer or kv_both (--kv-transfer-config)")
    if pd.secrets is None:
        raise MigrationError("unsupported", "this instance cannot send sessions: offers are signed with the shared "
                             "secret of the instances (kv_secret / EXECSTATE_KV_SECRET), and it has none")
    rt = exportable(sessions, session_id, access)
    state = rt.state
    assert isinstance(state, LMState)
    if state.identity != sessions.port.identity(state.identity.scope) and state.token_ids:
        raise MigrationError("stale_state", f"session {session_id!r} was computed under other weights or "
                             "provenance; reset and step with reprefill=True before migrating it")
    t0 = time.monotonic()
    bs = engine.block_size
    blocks = state.blocks
    n_full = blocks.num_tokens // bs if blocks is not None else 0
    rt.begin_migration()
    transfer_id = None
    try:
        params = None
        if n_full:
            assert blocks is not None
            keys = state.identity.chain(state.token_ids, bs, num_blocks=n_full)
            routes = state.routes.rows(0, n_full * bs) if state.routes is not None else None
            try:
                handoff = pd.export_blocks(blocks.block_ids[:n_full], keys, routes)
            except TransferError as e:
                raise MigrationError(e.code.value, f"exporting the session's KV failed: {e.detail}") from None
            transfer_id = handoff.transfer_id
            params = handoff.to_params(pd.secrets)
        commit_by = time.time() + window_s
        offer = build_offer(rt, source_instance_id=pd.instance_id, provenance_digest=engine.provenance.digest(),
                            handoff=params, commit_by=commit_by, nonce=nonce, target_engine_id=target_engine_id)
        payload = encode_offer(offer, pd.secrets)
    except BaseException:
        if transfer_id is not None:
            pd.release_export(transfer_id)
        rt.end_migration()
        raise
    return Outgoing(session_id, nonce, target_engine_id, payload, transfer_id, n_full, len(state.token_ids),
                    commit_by, len(rt.checkpoints), t0, rt)


def finish_export(sessions: LMSessions, out: Outgoing, ok: bool) -> None:
    """The target acknowledged the import (``ok``: close the source session) or the source may serve
    it again (the caller made sure the target will never serve it: module docstring)."""
    engine = sessions.engine
    rt = out.runtime
    assert rt is not None
    rt.end_migration()
    if out.transfer_id is not None and engine.pd is not None:
        engine.pd.release_export(out.transfer_id)
    access = Access(rt.owner, rt.holder)
    if ok and sessions.manager.get(out.session_id, access) is rt:
        sessions.close(out.session_id, access)

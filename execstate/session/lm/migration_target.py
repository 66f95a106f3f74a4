"""The target side of a session migration (docs/contracts.md 5, 6): engine thread only.

:func:`begin_import` takes the target's ``LMSessions`` (the engine's session owner) and the
source's signed offer (``session/lm/migration_wire.py``) and, before it allocates anything, checks
(``migration_state.accept_offer``) who sent it (the offer's HMAC: always required), that it is for
this engine, the handoff (``HandoffTrust``, as a PD decode instance does), the provenance digest
(same model, weights, dtype, numerics, salt), the offer against this model
(``migration_state.check_offer``), the deadline, the session id (``conflict`` if the offer's
tenant has it open here), the capacity and the tenant's quota. Then, for the
exported full blocks, keys this instance computes itself from its own root and the offer's
tokens: leading blocks its own prefix cache holds are used as they are (their route rows are this
instance's records, as for PD); the rest are loaded from the source on the transfer thread
(``RemoteLoads.submit_owned``: handshake, manifest checked against those keys, NIXL read,
per-block checksums). The engine keeps stepping meanwhile.

When the load finished (:meth:`RemoteLoads.poll`, on the engine thread) the import settles:

- failure policy ``fail``: any transfer error fails the migration; ``recompute``: the verified
  prefix is kept and the rest is recomputed by the session's next step;
- the verified blocks' route records (from the manifest, with the KV) must equal the control
  state's rows for them, else ``route_mismatch`` (a desync between the two channels);
- then the session is created, under the offer's tenant, with the source's id, branch id, step
  index, epochs, RNG state, sampling parameters, priority, pending events and acknowledgements,
  **not serving**: it is MIGRATING (every call but ``close`` refused) until the source, having
  closed its own copy, commits the hand-over (:meth:`ImportHandle.commit`: OPEN from then on); it
  holds the verified (and
  locally cached) blocks; the partial tail and any unverified blocks have no KV here and are
  recomputed by its next step. The route rows of those tokens are the source's (the rows that
  produced the tokens it sampled; the next step keeps them, as a preempted request keeps the rows
  of its first computation: ``engine/route_trace.py``). Its *origin* (what ``reset`` returns to
  without a checkpoint) is the migrated state. Checkpoints are not migrated.

On any failure every block taken is freed (blocks a stuck NIXL read may still write stay fenced
by ``RemoteLoads``) and the future gets a :class:`MigrationError`: the target holds nothing.
:meth:`ImportHandle.abandon` (the source gave up or aborted, or the deadline passed) fails the
import at once and, if the session was already created and not committed, closes it. So the
target never serves a session the source did not give up (docs/security.md: at most one server serves a
session at any time; the HTTP hand-over's rules: ``serve/sessions/migration.py``).
"""

from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass, field

import numpy as np

from execstate.engine.route_trace import RouteTrace
from execstate.engine.session_port import BlockId, HandoffRefused, NoFreeBlocks, SessionPort
from execstate.identity.keys import BlockKey
from execstate.session.lm.migration_state import (
    accept_offer,
    event_queue,
    grammar_state,
    offer_owner,
    offer_scope,
    rng_state,
    route_rows,
    sampling_params,
)
from execstate.session.lm.migration_wire import SessionOffer
from execstate.session.lm.sessions import LMSessions
from execstate.session.lm.state import LMState
from execstate.session.runtime.access import Access
from execstate.session.runtime.events import EventQueue, SessionEventError
from execstate.session.runtime.lifecycle import SessionRuntime, SessionStatus
from execstate.session.runtime.migration import MigrationError
from execstate.transfer.handoff import Handoff
from execstate.transfer.importer import LoadResult


@dataclass(frozen=True)
class MigrationResult:
    """What the target did. ``tokens_recomputed``: context tokens without KV here (the partial
    tail and unverified blocks), computed by the session's next step. ``load_error``: why part of
    the KV is recomputed (policy ``recompute``), else None. ``seconds``: offer received -> created."""

    session_id: str
    num_tokens: int
    blocks_transferred: int
    blocks_from_cache: int
    blocks_recomputed: int
    tokens_recomputed: int
    kv_bytes: int
    control_bytes: int
    load_error: str | None
    seconds: float


@dataclass(eq=False)
class ImportHandle:
    """An import in progress. ``future`` gets the :class:`MigrationResult` or the error."""

    sessions: LMSessions
    offer: SessionOffer
    keys: list[BlockKey]
    hits: list[BlockId]
    dst: list[BlockId]
    handoff: Handoff | None
    queue: EventQueue
    state: LMState
    rows: np.ndarray | None
    t0: float
    job_id: int | None = None
    abandoned: bool = False
    created: bool = False
    runtime: SessionRuntime | None = None  # the created session (MIGRATING until committed)
    future: concurrent.futures.Future[MigrationResult] = field(default_factory=concurrent.futures.Future)

    @property
    def port(self) -> SessionPort:
        return self.sessions.port

    def commit(self) -> None:
        """Engine thread: the source closed its copy; serve the session from now on (idempotent).
        ``MigrationError("aborted")`` when the import was abandoned or the session ended meanwhile."""
        rt = self.runtime
        if rt is None or self.abandoned or rt.status not in (SessionStatus.MIGRATING, SessionStatus.OPEN):
            raise MigrationError("aborted", f"the import of session {self.offer.session_id!r} was abandoned")
        rt.end_migration()

    def abandon(self, why: str = "the source gave up waiting") -> None:
        """Engine thread: fail the import now (``timeout``); undo a session already created and not
        committed."""
        if self.future.done():
            rt = self.runtime
            if rt is not None and rt.status is SessionStatus.MIGRATING:  # created, never committed: undo
                self.abandoned = True
                access = Access(rt.owner, rt.holder)
                if self.sessions.manager.get(rt.session_id, access) is rt:
                    self.sessions.close(rt.session_id, access)
            return
        self.abandoned = True
        if self.job_id is not None:
            self.port.cancel_load(self.job_id)
        self.future.set_exception(MigrationError("timeout", why))


def begin_import(sessions: LMSessions, data: bytes | tuple[SessionOffer, bool]) -> ImportHandle:
    """Check the offer and start loading its blocks (module docstring); ``MigrationError`` with
    nothing taken when it is refused. ``data``: the envelope's bytes, or what ``decode_offer``
    made of them with this engine's ``pd.secrets`` (a caller that decodes off the engine thread)."""
    t0 = time.monotonic()
    engine, port = sessions.engine, sessions.port
    offer, handoff = accept_offer(sessions, data)
    mc, bs = engine.model_config, engine.block_size
    route_shape = (mc.num_moe_layers, mc.top_k) if engine.return_routes else None
    identity = port.identity(offer_scope(offer, sessions.sharing))
    state = LMState(engine.kv_holds, bs, route_shape, sampling_params(offer, mc.vocab_size), offer.seed, identity,
                    offer.priority)
    state.token_ids = list(offer.token_ids)
    state.generator.set_state(rng_state(offer))
    state.grammar = grammar_state(offer, engine.grammar)
    rows = route_rows(offer, route_shape, mc.num_experts or 0) if route_shape is not None else None
    queue = event_queue(offer, sessions.kinds, sessions.max_pending_events)
    n = handoff.num_blocks if handoff is not None else 0
    keys = identity.chain(state.token_ids, bs, num_blocks=n)
    hits = port.take_local_hits(keys)
    imp = ImportHandle(sessions, offer, keys, hits, [], handoff, queue, state, rows, t0)
    if handoff is None:
        _settle(imp, None, False)
        return imp
    if len(hits) == n:  # our own cache holds every offered block: let the source release now
        port.release_handoff(handoff)
        _settle(imp, None, False)
        return imp
    try:
        imp.dst = port.allocate(n - len(hits))
    except NoFreeBlocks:
        _free(imp)
        port.release_handoff(handoff)
        raise MigrationError("capacity", f"the KV pool has no room for {n - len(hits)} blocks") from None
    try:
        imp.job_id = port.load_handoff(handoff, keys[len(hits):], imp.dst, len(hits),
                                       lambda res, fenced: _settle(imp, res, fenced))
    except HandoffRefused as e:
        _free(imp)
        raise MigrationError("capacity", str(e)) from None
    return imp


def _free(imp: ImportHandle) -> None:
    """Give back every block the import still owns (tail first)."""
    owned, imp.hits, imp.dst = imp.hits + imp.dst, [], []
    imp.port.free(owned)


def _settle(imp: ImportHandle, res: LoadResult | None, fenced: bool) -> None:
    """The load ended (or there was none): create the session, or fail and free everything."""
    if imp.abandoned:
        _free(imp)
        return
    try:
        _create(imp, res, fenced)
    except Exception as e:  # a bug must not leak blocks or leave the caller waiting either
        _free(imp)
        if not imp.created:
            imp.state.release()  # blocks it adopted, if any
        err = e if isinstance(e, MigrationError) else MigrationError("internal", f"{type(e).__name__}: {e}")
        imp.future.set_exception(err)


def _create(imp: ImportHandle, res: LoadResult | None, fenced: bool) -> None:
    port, offer, bs = imp.port, imp.offer, imp.port.block_size
    if time.time() > offer.commit_by:
        raise MigrationError("timeout", "the KV load ended after the offer's commit deadline")
    verified, load_error, kv_bytes, control_bytes = 0, None, 0, 0
    if imp.dst:
        if res is None:
            raise MigrationError("cancelled", "the KV load was cancelled before it started")
        kv_bytes, control_bytes = res.kv_bytes, res.control_bytes
        if fenced:
            raise MigrationError("timeout", f"the KV load could not be cancelled after a timeout: {res.error}")
        if not res.ok:
            code = res.error_code.value if res.error_code is not None else "internal"
            if port.failure_policy == "fail":
                raise MigrationError(code, f"loading the session's KV failed: {res.error}")
            load_error = res.error
        verified = res.num_blocks_verified
        if imp.rows is not None and verified:
            start = len(imp.hits) * bs
            sent = imp.rows[start : start + verified * bs]
            if res.routes is None or not np.array_equal(res.routes[: len(sent)], sent):
                raise MigrationError("route_mismatch", "the route records sent with the KV differ from the "
                                     "session's route rows (the control state and the KV disagree)")
    kept = imp.hits + imp.dst[:verified]
    port.free(imp.dst[verified:])
    imp.dst = imp.dst[:verified]
    state = imp.state
    if imp.rows is not None:
        rows = imp.rows.copy()
        own = port.own_route_rows(imp.keys[: len(imp.hits)]) if imp.hits else None
        if own is not None:  # our own records for our own blocks
            rows[: len(imp.hits) * bs] = own
        trace = RouteTrace(rows.shape[1], rows.shape[2], capacity=max(len(rows), 64))
        if len(rows):
            trace.fill(0, rows)
        state.routes = trace
    if kept:
        state.blocks = port.hold(kept, imp.keys[: len(kept)], len(imp.hits))
        imp.hits, imp.dst = [], []  # the session owns them now
    sessions = imp.sessions
    owner = offer_owner(offer)
    try:
        sid = sessions.manager.admit(offer.session_id, Access(owner))
    except SessionEventError as e:
        raise MigrationError("conflict" if e.code == "invalid" else e.code, e.message) from None
    rt = SessionRuntime(sid, state, imp.queue, offer.branch_id, offer.step_index, offer.event_epoch,
                        offer.max_event_epoch, owner=owner)
    sessions.manager.add(rt)
    rt.begin_migration()  # imported, not served: the commit makes it OPEN
    imp.runtime = rt
    imp.created = True
    n_exported = len(imp.keys)
    imp.future.set_result(MigrationResult(
        session_id=sid, num_tokens=len(offer.token_ids), blocks_transferred=verified,
        blocks_from_cache=len(kept) - verified, blocks_recomputed=n_exported - len(kept),
        tokens_recomputed=max(len(offer.token_ids) - 1, 0) - len(kept) * bs, kv_bytes=kv_bytes,
        control_bytes=control_bytes, load_error=load_error, seconds=time.monotonic() - imp.t0))

"""An LM session's control state to and from its :class:`SessionOffer` (``session/lm/migration_wire.py``).

Source side: :func:`build_offer` reads a session (OPEN, its state computed under the engine's
current provenance) into an offer. Target side: :func:`check_offer` validates a decoded offer
against the receiving model before anything is allocated (sizes, token ids inside the vocabulary,
KV and route row counts consistent with the context, route rows in range without duplicate
experts, the RNG state's size, the sampling parameters as the engine validates them, event ids),
and :func:`event_queue`, :func:`sampling_params`, :func:`route_rows`, :func:`rng_state`,
:func:`grammar_state` (the structured-output matcher, its tokens replayed) turn the checked fields
into the session's own objects. :func:`accept_offer` is the target's whole
admission (the offer's signature, that it is for this engine, its tenant, its handoff, provenance,
``check_offer``, deadline, id in the tenant's namespace, capacity, the tenant's quota). A malformed
field is ``MigrationError("invalid")`` naming it.

Pending events travel as their clients submitted them (``input`` as ``{"token_ids": [...]}``,
``sampling`` as ``{field: value}``, a composite as ``{"events": [...]}``) and the target submits
them again through its own event kinds, so they are validated by the model that will apply them.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from execstate.engine.grammar.compiler import GrammarCompiler
from execstate.engine.grammar.matcher import GrammarMatcher, GrammarSnapshot
from execstate.engine.grammar.spec import StructuredOutputsParams
from execstate.engine.sampling_params import SamplingParams
from execstate.engine.validation import validate_logit_bias, validate_sampling
from execstate.identity.scope import CacheScope, PrefixSharing
from execstate.identity.tenant import tenant_id
from execstate.session.lm.events import INPUT
from execstate.session.lm.migration_wire import (
    FORMAT_VERSION,
    SessionOffer,
    WireGrammar,
    WireSampling,
    decode_offer,
)
from execstate.session.lm.sessions import LMSessions
from execstate.session.lm.state import LMState
from execstate.session.runtime.access import SESSIONS, Owner
from execstate.session.runtime.events import Event, EventKind, EventQueue, SessionEventError
from execstate.session.runtime.lifecycle import SessionRuntime
from execstate.session.runtime.migration import MigrationError
from execstate.session.runtime.migration_wire import events_to_wire, queue_from_wire
from execstate.transfer.handoff import Handoff, HandoffError

_SAMPLING = tuple(WireSampling.__struct_fields__)
RNG_NBYTES = torch.Generator().get_state().numel()


def _bad(field: str, why: str) -> MigrationError:
    return MigrationError("invalid", f"session offer {field}: {why}")


# -- source side ---------------------------------------------------------------------------------
def offer_scope(offer: SessionOffer, sharing: PrefixSharing) -> CacheScope:
    """The cache scope the offered session gets here: its tenant and salt under this server's
    shared prefix groups; ``invalid`` naming the field when either is not valid."""
    try:
        return sharing.scope(tenant_id(offer.tenant), offer.cache_salt)
    except ValueError as exc:
        raise MigrationError("invalid", f"session offer: {exc}") from None


def build_offer(rt: SessionRuntime, *, source_instance_id: str, provenance_digest: str,
                handoff: dict[str, Any] | None, commit_by: float, nonce: str, target_engine_id: str) -> SessionOffer:
    state = rt.state
    assert isinstance(state, LMState)
    n = len(state.token_ids)
    rows = None
    if state.routes is not None:
        rows = np.ascontiguousarray(state.routes.rows(0, max(n - 1, 0)), dtype="<i2").tobytes()
    snap = rt.events.snapshot()
    gram = state.grammar_snapshot()
    return SessionOffer(
        format_version=FORMAT_VERSION, session_id=rt.session_id, tenant=rt.owner.tenant, nonce=nonce,
        target_engine_id=target_engine_id, source_instance_id=source_instance_id,
        provenance_digest=provenance_digest, cache_salt=state.identity.scope.salt, token_ids=list(state.token_ids),
        num_kv_tokens=state.num_kv_tokens, route_rows=rows, step_index=rt.step_index, event_epoch=rt.event_epoch,
        max_event_epoch=rt.max_event_epoch, branch_id=rt.branch_id, seed=state.seed,
        rng_state=bytes(state.generator.get_state().numpy()),
        sampling=_wire_sampling(state.params), priority=state.priority,
        events=events_to_wire(snap, _payload), handoff=handoff, commit_by=commit_by,
        grammar=WireGrammar(gram.spec, list(gram.token_ids)) if gram is not None else None,
    )


def _wire_sampling(params: SamplingParams) -> WireSampling:
    fields = {f: getattr(params, f) for f in _SAMPLING}
    so = params.structured_outputs
    return WireSampling(**{**fields, "structured_outputs": so.to_wire() if so is not None else None})


def _payload(e: Event) -> Any:
    """An LM event's validated data as a client would submit it."""
    if e.kind == INPUT:
        return {"token_ids": list(e.data)}
    data = dict(e.data)
    if isinstance(data.get("structured_outputs"), StructuredOutputsParams):  # as a client sends it
        spec = data["structured_outputs"]
        data["structured_outputs"] = {spec.kind: spec.value}
    return data


# -- target side -----------------------------------------------------------------------------------
def check_offer(offer: SessionOffer, *, vocab_size: int, max_model_len: int,
                route_shape: tuple[int, int] | None, num_experts: int, rng_nbytes: int) -> None:
    """Validate ``offer`` against the receiving model (module docstring)."""
    n = len(offer.token_ids)
    if n > max_model_len:
        raise _bad("token_ids", f"{n} tokens, but this instance's max_model_len is {max_model_len}")
    if n and max(offer.token_ids) >= vocab_size:
        raise _bad("token_ids", f"token id {max(offer.token_ids)} is outside the vocabulary [0, {vocab_size})")
    if offer.num_kv_tokens > max(n - 1, 0):
        raise _bad("num_kv_tokens", f"{offer.num_kv_tokens} tokens with KV in a context of {n}")
    if offer.event_epoch > offer.max_event_epoch:
        raise _bad("event_epoch", f"{offer.event_epoch} is above max_event_epoch {offer.max_event_epoch}")
    if len(offer.rng_state) != rng_nbytes:
        raise _bad("rng_state", f"{len(offer.rng_state)} bytes; this instance's generator state has {rng_nbytes}")
    if not math.isfinite(offer.commit_by):
        raise _bad("commit_by", "must be a finite Unix time")
    if route_shape is not None:
        route_rows(offer, route_shape, num_experts)  # validates
    sampling_params(offer, vocab_size)
    ev = offer.events
    ids = [p.event_id for p in ev.pending]
    if any(b <= a for a, b in zip(ids, ids[1:], strict=False)):
        raise _bad("events.pending", "event ids must increase")
    known = ids + [a.event_id for a in ev.acks]
    if known and (ev.last_event_id is None or max(known) > ev.last_event_id):
        raise _bad("events", f"event ids above the watermark {ev.last_event_id}")


def offer_owner(offer: SessionOffer) -> Owner:
    """The owner the target creates the session under: the offer's tenant, the session API's realm."""
    try:
        return Owner(tenant_id(offer.tenant), SESSIONS)
    except ValueError as e:
        raise _bad("tenant", str(e)) from None


def accept_offer(sessions: LMSessions, data: bytes | tuple[SessionOffer, bool]) -> tuple[SessionOffer, Handoff | None]:
    """Every check before anything is allocated (module docstring): the signature, this engine as
    the target, the tenant, the handoff, the provenance, the offer against this model, the
    deadline, the session id, the capacity and the tenant's quota."""
    engine = sessions.engine
    pd = engine.pd
    if pd is None:
        raise MigrationError("unsupported", "this instance cannot receive sessions: it needs a PD connector "
                             "(--kv-transfer-config, role kv_consumer or kv_both)")
    offer, signed = decode_offer(data, pd.secrets) if isinstance(data, bytes) else data
    if not signed:
        raise MigrationError("unauthorized", "an unsigned session offer (every offer must be signed)")
    if offer.target_engine_id != pd.instance_id:
        raise MigrationError("wrong_target", f"the offer is for engine {offer.target_engine_id!r}, not this one")
    owner = offer_owner(offer)
    params = offer.handoff
    handoff = None
    if params is not None:
        if not pd.is_consumer:
            raise MigrationError("unsupported", "this instance cannot load KV (PD role kv_producer)")
        try:
            handoff = pd.accept_handoff(params)
        except HandoffError as e:
            raise MigrationError("unauthorized", str(e)) from None
        if handoff.remote_engine_id != offer.source_instance_id:
            raise MigrationError("invalid", "the handoff names another engine than the offer's source")
    if offer.provenance_digest != engine.provenance.digest():
        raise MigrationError("incompatible", "the source's provenance (model, weights version, dtype, numerics or "
                             "cache salt) differs from this instance's")
    mc = engine.model_config
    route_shape = (mc.num_moe_layers, mc.top_k) if engine.return_routes else None
    check_offer(offer, vocab_size=mc.vocab_size, max_model_len=engine.max_model_len, route_shape=route_shape,
                num_experts=mc.num_experts or 0, rng_nbytes=RNG_NBYTES)
    if offer.commit_by <= time.time():
        raise MigrationError("timeout", "the offer arrived after its commit deadline")
    manager = sessions.manager
    if any(rt.session_id == offer.session_id for rt in manager.resident(owner)):
        raise MigrationError("conflict", f"session {offer.session_id!r} is already open on this instance")
    if manager.num_resident >= manager.max_sessions and manager.eviction is None:
        raise MigrationError("capacity", f"{manager.num_resident} sessions are resident "
                             f"(max_sessions={manager.max_sessions})")
    if handoff is not None and (handoff.num_blocks * engine.block_size > offer.num_kv_tokens):
        raise MigrationError("invalid", f"the handoff offers {handoff.num_blocks} blocks for "
                             f"{offer.num_kv_tokens} tokens with KV")
    try:
        manager.check_quota(owner.tenant, "sessions", lambda: len(manager.resident(owner)))
        manager.check_quota(owner.tenant, "pinned_blocks", lambda: sessions.pinned_blocks(owner.tenant),
                            handoff.num_blocks if handoff is not None else 0)
    except SessionEventError as e:
        raise MigrationError(e.code, e.message) from None
    return offer, handoff


def route_rows(offer: SessionOffer, route_shape: tuple[int, int], num_experts: int) -> np.ndarray:
    """The context's route rows, int16 ``[len(token_ids) - 1, n_moe_layers, top_k]`` (a copy)."""
    layers, top_k = route_shape
    rows_n = max(len(offer.token_ids) - 1, 0)
    if offer.route_rows is None:
        raise MigrationError("incompatible", "this instance returns routes but the session offer carries none")
    if len(offer.route_rows) != rows_n * layers * top_k * 2:
        raise _bad("route_rows", f"{len(offer.route_rows)} bytes; {rows_n} rows of [{layers}, {top_k}] int16 "
                   f"need {rows_n * layers * top_k * 2}")
    rows = np.frombuffer(offer.route_rows, dtype="<i2").reshape(rows_n, layers, top_k).astype(np.int16)
    if rows.size and (rows.min() < 0 or rows.max() >= num_experts):
        raise _bad("route_rows", f"expert ids outside [0, {num_experts})")
    if top_k > 1 and rows.size and np.any(np.diff(np.sort(rows, axis=-1), axis=-1) == 0):
        raise _bad("route_rows", "a row lists an expert twice")
    return rows


def sampling_params(offer: SessionOffer, vocab_size: int) -> SamplingParams:
    """The session's ``SamplingParams`` (n=1, free routes), validated as the engine does."""
    fields = {f: getattr(offer.sampling, f) for f in _SAMPLING}
    try:
        wire = fields["structured_outputs"]
        fields["structured_outputs"] = StructuredOutputsParams.from_wire(wire) if wire is not None else None
        params = replace(SamplingParams(), **fields, seed=offer.seed)
        validate_sampling(params, vocab_size)
        validate_logit_bias(params.logit_bias, vocab_size)
    except ValueError as e:
        raise _bad("sampling", str(e)) from None
    return params


def grammar_state(offer: SessionOffer, compiler: GrammarCompiler | None) -> GrammarMatcher | None:
    """The session's matcher, its accepted tokens replayed (None: the output is not constrained)."""
    g = offer.grammar
    if g is None:
        return None
    if compiler is None:
        raise MigrationError("incompatible", "the session's output is constrained but this model has no tokenizer")
    try:
        return compiler.restore(GrammarSnapshot(g.spec, tuple(g.token_ids)))
    except ValueError as e:
        raise _bad("grammar", str(e)) from None


def rng_state(offer: SessionOffer) -> torch.Tensor:
    """The generator state as a fresh uint8 tensor (``torch.Generator.set_state``'s argument)."""
    state = torch.frombuffer(bytearray(offer.rng_state), dtype=torch.uint8).clone()
    try:
        torch.Generator().set_state(state)
    except RuntimeError as e:
        raise _bad("rng_state", f"not a generator state: {e}") from None
    return state


def event_queue(offer: SessionOffer, kinds: dict[str, EventKind], max_pending: int) -> EventQueue:
    """A queue holding the offer's pending events (validated by ``kinds``), watermark and acks."""
    ev = offer.events
    if len(ev.pending) > max_pending:
        raise MigrationError("capacity", f"{len(ev.pending)} pending events; this instance keeps at most "
                             f"{max_pending} per session (max_session_events)")
    return queue_from_wire(ev, kinds, max_pending, _bad)

"""An LM session's state to and from its hibernation manifest (``session/lm/hibernation_wire.py``).

:func:`block_units` lists the full blocks a session (or one of its checkpoints) holds as the
units to write (``BlockUnit``, ``SessionPort.store_units``): each under its chain key, with its parent,
provenance root, tokens and route rows. :func:`state_from_manifest` rebuilds the session's
``LMState`` and event queue from a decoded manifest, after checking it against this engine (the
provenance digest, the offer's checks of ``migration_state.check_offer``) and against itself
(:func:`check_manifest`: its unit keys are the keys this engine computes from its own root and
the manifest's tokens, and its session state key is the one its contents give). Every failure is
``MigrationError``: ``incompatible`` (another model, weights, numerics or salt) or ``desync``
(the manifest disagrees with itself or with what the caller expects: a stale step index or
event epoch, other tokens, units of another chain).
"""

from __future__ import annotations

import numpy as np

from execstate.engine.route_trace import RouteTrace
from execstate.engine.session_engine import SessionEngine
from execstate.engine.session_port import BlockUnit, HeldBlocks, SessionPort, UnitOrigin
from execstate.identity.execution import ExecutionIdentity
from execstate.identity.scope import PrefixSharing
from execstate.identity.session_keys import SessionKey, session_state_key
from execstate.session.lm.hibernation_wire import HibernationManifest
from execstate.session.lm.migration_state import (
    RNG_NBYTES,
    check_offer,
    event_queue,
    grammar_state,
    offer_scope,
    rng_state,
    route_rows,
    sampling_params,
)
from execstate.session.lm.state import LMState
from execstate.session.runtime.events import EventKind, EventQueue
from execstate.session.runtime.migration import MigrationError


def block_units(token_ids: list[int] | tuple[int, ...], identity: ExecutionIdentity, held: HeldBlocks | None,
                rows: np.ndarray | None, block_size: int,
                weights_version: str | None = None) -> list[BlockUnit]:
    """The unit (block id, key, origin, route bytes) of each full block ``held`` has KV for
    (``weights_version``: the identity's, named in the units' records; None when unknown)."""
    if held is None:
        return []
    n_full = min(held.num_tokens, len(token_ids)) // block_size
    keys = identity.chain(token_ids, block_size, num_blocks=n_full)
    root = identity.root
    out = []
    for i, key in enumerate(keys):
        lo, hi = i * block_size, (i + 1) * block_size
        r = None
        if rows is not None and len(rows) >= hi:
            r = np.ascontiguousarray(rows[lo:hi], dtype="<i2").tobytes()
        origin = UnitOrigin(keys[i - 1] if i else root, root, tuple(token_ids[lo:hi]), weights_version,
                            identity.scope.tenant)
        out.append(BlockUnit(held.block_ids[i], key, origin, r))
    return out


def manifest_state_key(m: HibernationManifest, state: LMState) -> SessionKey:
    """The session state key the manifest's contents give (its tokens under this engine's root)."""
    chain, tail = state.chain()
    o = m.offer
    return session_state_key(chain, tail, o.step_index, o.event_epoch, o.branch_id)


def desync(why: str) -> MigrationError:
    return MigrationError("desync", f"hibernated session: {why}")


def state_from_manifest(engine: SessionEngine, port: SessionPort, m: HibernationManifest, kinds: dict[str, EventKind],
                        max_pending: int, sharing: PrefixSharing) -> tuple[LMState, EventQueue]:
    """The session's state (no KV: its next step takes it from the pool, the tiers or recomputes
    it) and event queue (module docstring); ``sharing``: this server's shared prefix groups."""
    offer = m.offer
    if offer.provenance_digest != engine.provenance.digest():
        raise MigrationError("incompatible", "the session was computed under another provenance (model, weights "
                             "version, dtype or numerics) than this engine's")
    mc, bs = engine.model_config, engine.block_size
    route_shape = (mc.num_moe_layers, mc.top_k) if engine.return_routes else None
    check_offer(offer, vocab_size=mc.vocab_size, max_model_len=engine.max_model_len, route_shape=route_shape,
                num_experts=mc.num_experts or 0, rng_nbytes=RNG_NBYTES)
    identity = port.identity(offer_scope(offer, sharing))
    state = LMState(engine.kv_holds, bs, route_shape, sampling_params(offer, mc.vocab_size), offer.seed, identity,
                    offer.priority)
    state.token_ids = list(offer.token_ids)
    state.generator.set_state(rng_state(offer))
    state.grammar = grammar_state(offer, engine.grammar)
    if route_shape is not None:
        rows = route_rows(offer, route_shape, mc.num_experts or 0)
        trace = RouteTrace(*route_shape, capacity=max(len(rows), 64))
        if len(rows):
            trace.fill(0, rows)
        state.routes = trace
    check_manifest(m, state, bs)
    return state, event_queue(offer, kinds, max_pending)


def check_manifest(m: HibernationManifest, state: LMState, block_size: int) -> None:
    """``desync`` unless the manifest agrees with itself (module docstring)."""
    n = len(m.unit_keys)
    if n * block_size > len(state.token_ids):
        raise desync(f"{n} units for {len(state.token_ids)} tokens")
    want = state.identity.chain(state.token_ids, block_size, num_blocks=n)
    if [bytes(k) for k in want] != [bytes(k) for k in m.unit_keys]:
        raise desync("its unit keys are not the chain of its tokens under this engine's identity (units of "
                     "another block, chain, tenant or salt)")
    if bytes(manifest_state_key(m, state)) != bytes(m.state_key):
        raise desync("its session state key does not match its tokens, step index, event epoch and branch")

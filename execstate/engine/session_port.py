"""The session port: what a session kind does with its engine's blocks and hand-overs, named.

A session keeps its KV in the engine's block pool across steps and moves it between engines.
These are the operations it needs, so that it works on named, typed calls instead of the engine's
collaborators (the block pool, the route store, the KV holds, the PD connector's loads):

- this engine's id (:attr:`engine_id`: a hibernation's or a copy's manifests are named by it);
- the **root key** of an identity: :meth:`identity` (``KVCacheManager.identity``: every block key
  of a session derives from it);
- **local hits**: :meth:`take_local_hits`, the leading blocks of a key chain this engine's prefix
  cache already holds, each with a reference taken for the caller;
- **blocks**: :meth:`allocate` (``NoFreeBlocks`` when the pool is short, nothing taken),
  :meth:`free` (a chain's blocks, released tail first), :meth:`own_route_rows` (this engine's
  route records of cached blocks);
- **hold**: :meth:`hold` hands blocks the caller owns over to a ``HeldBlocks`` record the KV holds
  track (a session's or a checkpoint's); :meth:`store_units` writes held blocks to the offload
  tiers as units now (a hibernating or copied session's: ``BlockUnit``, ``UnitOrigin``);
- **steps**: :meth:`add_step` queues a session step (``StepRequest`` in, a ``FinishedStep`` to its
  hook at the end: ``engine/session_step.py``), :meth:`abort_step` cancels one, :meth:`release`
  drops held blocks (a finished step's the session does not keep); what a step is checked
  against: :attr:`max_model_len`, :attr:`grammar` (structured outputs);
- **accept a handoff**: :meth:`load_handoff` loads the blocks another engine exports into blocks the
  caller owns, on the transfer thread (``RemoteLoads.submit_owned``: handshake, manifest checked
  against the keys given, per-block checksums), :meth:`release_handoff` tells the source to
  release its export at once (every block was a local hit), :meth:`cancel_load`;
  :attr:`failure_policy` is the connector's (``fail`` or ``recompute``).

The state types in its signatures are re-exported here (a session kind names them through the
port, never through ``state/``): ``BlockId``, ``NoFreeBlocks`` (``state/block_pool.py``),
``HeldBlocks`` and ``BlockHolds``, which releases them (``state/block_holds.py``), ``BlockUnit``
and its ``UnitOrigin`` (``state/tiers/pool_units.py``).

Contract: engine thread only (the sessions object's owner runs every call there); no method
keeps a reference to what it is given beyond what it documents. One port per engine, built by
``LMSessions`` (``session/lm/sessions.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from execstate.engine.engine_facts import home_of
from execstate.engine.external_prefix import ExternalLoadError
from execstate.engine.grammar.compiler import GrammarCompiler
from execstate.engine.session_step import FinishedStep, StepRequest
from execstate.identity.execution import ExecutionIdentity
from execstate.identity.keys import BlockKey
from execstate.identity.scope import CacheScope
from execstate.state.block_holds import BlockHolds, HeldBlocks
from execstate.state.block_pool import BlockId, NoFreeBlocks
from execstate.state.tiers.pool_units import BlockUnit, UnitOrigin
from execstate.transfer.handoff import Handoff
from execstate.transfer.importer import LoadResult

if TYPE_CHECKING:
    from execstate.engine.llm_engine import LLMEngine
    from execstate.engine.pd_loads import RemoteLoads

__all__ = ["BlockHolds", "BlockId", "BlockUnit", "FinishedStep", "HandoffRefused", "HeldBlocks", "NoFreeBlocks",
           "SessionPort", "StepRequest", "UnitOrigin"]


class HandoffRefused(Exception):
    """A hand-over's load cannot start (over a limit of the PD connector); nothing was started
    and the source was told to release its export."""


class SessionPort:
    def __init__(self, engine: LLMEngine) -> None:
        self._engine = engine

    @property
    def block_size(self) -> int:
        return self._engine.block_size

    @property
    def engine_id(self) -> str:
        """This engine's id: its PD instance id, else its offload tiers' (``EngineHome``)."""
        return home_of(self._engine).engine_id

    # -- steps -----------------------------------------------------------------------------------
    @property
    def max_model_len(self) -> int:
        return self._engine.max_model_len

    @property
    def grammar(self) -> GrammarCompiler | None:
        """The compiler of structured outputs (None without the model's tokenizer)."""
        return self._engine.grammar

    def add_step(self, step: StepRequest) -> None:
        """Queue the session step ``step`` (``engine/session_step.py``); ValueError (nothing
        changed) when the engine refuses it. Its held blocks are the step's from then on; its
        ``on_finished`` gets them back in a ``FinishedStep`` when it ends."""
        self._engine.add_step_request(step)

    def abort_step(self, request_id: str) -> bool:
        """Cancel the step ``request_id`` now; its hook and final output come with the next engine
        step. False if no such step is in flight."""
        return self._engine.abort_request_deferred(request_id)

    def release(self, held: HeldBlocks) -> None:
        """Drop the caller's held blocks (``BlockHolds.release``)."""
        self._engine.kv_holds.release(held)

    # -- keys and blocks ------------------------------------------------------------------------
    def identity(self, scope: CacheScope) -> ExecutionIdentity:
        """The identity (its root key) the blocks of ``scope`` are keyed under on this engine now."""
        return self._engine.kv_manager.identity(scope)

    def take_local_hits(self, keys: Sequence[BlockKey]) -> list[BlockId]:
        """The leading blocks of the chain ``keys`` this engine's prefix cache holds, with their
        route records when the engine returns routes (a unit without its record is not a hit),
        each with one reference taken for the caller; ``[]`` with prefix caching off."""
        engine = self._engine
        hits: list[BlockId] = []
        if not engine.config.enable_prefix_caching:
            return hits
        for key in keys:
            bid = engine.block_pool.lookup(key)
            if bid is None or (engine.route_store is not None and not engine.route_store.has(key)):
                break
            hits.append(bid)
        engine.block_pool.acquire(hits)
        return hits

    def allocate(self, n: int) -> list[BlockId]:
        """``n`` fresh blocks, one reference each, owned by the caller; ``NoFreeBlocks`` (nothing
        taken) when the pool has fewer free."""
        return self._engine.block_pool.allocate(n)

    def free(self, blocks: Sequence[BlockId]) -> None:
        """Drop the caller's reference to each block of a chain (given in chain order; released
        tail first, so the chain's head stays cached longest)."""
        if blocks:
            self._engine.block_pool.free(list(reversed(blocks)))

    def own_route_rows(self, keys: Sequence[BlockKey]) -> np.ndarray | None:
        """This engine's route records of the cached blocks ``keys`` (rows in chain order); None
        when it returns no routes. Every key must have its record (a local hit does)."""
        store = self._engine.route_store
        if store is None:
            return None
        rows = []
        for k in keys:
            record = store.get(k)
            if record is None:
                raise KeyError(f"no route record for block {k.hex()}")
            rows.append(record)
        return np.concatenate(rows)

    def hold(self, blocks: list[BlockId], keys: list[BlockKey], num_cached: int) -> HeldBlocks:
        """Hand the caller's references to full ``blocks`` (keyed ``keys``; the first
        ``num_cached`` were local hits) over to a ``HeldBlocks`` record the KV holds track."""
        held = HeldBlocks(blocks, len(blocks) * self._engine.block_size, keys, num_cached)
        return self._engine.kv_holds.adopt(held)

    def store_units(self, units: Sequence[BlockUnit]) -> int:
        """Write the caller's held blocks to the offload tiers as units now, each unless a tier has
        it already (``OffloadConnector.store_units``; never raises); how many are in a tier or on
        their way (0 without tiers)."""
        offload = self._engine.offload
        return offload.store_units(units) if offload is not None else 0

    # -- hand-overs (the PD connector) -----------------------------------------------------------
    @property
    def failure_policy(self) -> str:
        """What a failed load means: ``fail`` (the hand-over fails) or ``recompute`` (keep the
        verified prefix); ``fail`` without a PD connector."""
        pd = self._engine.pd
        return pd.cfg.failure_policy if pd is not None else "fail"

    def load_handoff(self, handoff: Handoff, keys: list[BlockKey], dst: list[BlockId], num_local: int,
                     on_done: Callable[[LoadResult | None, bool], None]) -> int:
        """Load the exported blocks ``keys`` (after the ``num_local`` leading local hits) into
        ``dst`` (the caller's blocks) on the transfer thread; returns the job id.
        ``on_done(result, fenced)`` runs once on the engine thread (``result`` None: cancelled
        before it started; ``fenced``: a read could not be cancelled, the blocks stay fenced).
        :class:`HandoffRefused` over a limit (nothing started, the source told to release)."""
        try:
            return self._loads().submit_owned(handoff.remote_addr, handoff.transfer_id, handoff.epoch, keys, dst,
                                              self._engine.return_routes, num_local, on_done)
        except ExternalLoadError as e:
            raise HandoffRefused(str(e)) from None

    def release_handoff(self, handoff: Handoff) -> None:
        """Tell the source to release the export now (nothing will be loaded from it)."""
        self._loads().worker.submit_release(handoff.remote_addr, handoff.transfer_id)

    def cancel_load(self, job_id: int) -> None:
        """Skip the load ``job_id`` if it has not started (its ``on_done`` then gets ``None``)."""
        pd = self._engine.pd
        if pd is not None and pd.loads is not None:
            pd.loads.cancel_owned(job_id)

    def _loads(self) -> RemoteLoads:
        pd = self._engine.pd
        if pd is None or pd.loads is None:
            raise RuntimeError("this engine has no PD connector that loads (role kv_consumer or kv_both)")
        return pd.loads

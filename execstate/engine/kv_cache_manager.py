"""Maps requests to physical KV blocks: prefix lookup, allocation, commit, free.

Pure Python (no torch). A cached full block is one *consistency unit* (docs/contracts.md 3):
its KV (in the block pool), its route record (in the route store, keyed by the same
block key) and its provenance (folded into the key). This class is the one place
that creates, hits and releases units:

- ``admit``: prefix hits need an equal block key AND, when route return is on, a
  route record for that key (missing record = miss, the block is recomputed).
  Hit rows are copied into the request's trace and their records leased.
- ``allocate``: reserves slots for new tokens; returns False (no side effect) when
  the pool is short, so the scheduler can preempt.
- ``commit``: after a step, registers the request's newly filled blocks with their
  route rows (first writer wins for a key computed twice).
- ``release``: frees blocks (tail first, so tails are evicted first) and, when the
  request is finished, releases its route leases.
- ``apply_external``: commits a finished PD load or offload reload (``ExternalPrefix``) of a
  request that ``admit`` left waiting for it.

Offload tiers (``engine/offload.py``): when ``pool_units`` is set, ``commit`` notes what each
block it caches was computed from (parent key, root, tokens), which the write-back of the block
needs when the pool evicts it (requests that force routes are not noted: never offloaded).

Session steps (``Request.session.keep_blocks``, ``state/block_holds.py``): a request that arrives
holding blocks is admitted without a prefix lookup for the held part; only its new tokens get
slots. If its partial tail block is shared (a checkpoint or a fork pins it: ``ref_count > 1``),
that one block is copied first (copy-on-write: a fresh block, the KV copy queued in
``take_block_copies`` for the engine to run before the forward pass, one reference on the old
block dropped); full blocks are never written again, so they stay shared as they are. At finish
(``release(finished=True)``) such a request's blocks covering its computed tokens are handed back
as ``req.session.returned_blocks`` (registered in the block holds) instead of being freed.

KV events (``state/kv_events/recorder.py``): when ``events`` is set, ``commit`` reports each run of
blocks it registered in the pool (one ``stored`` call per run: keys, parent key, token ids, the
weights version, the request's scope); the pool reports its evictions itself.

Keys are derived from one value, the request's :class:`ExecutionIdentity` (:meth:`identity_of`:
this engine's provenance, the request's route mode and its :class:`CacheScope`, i.e. its tenant
or shared group and its salt), by ``ExecutionIdentity.extend``. So a weights update makes every
old unit unreachable for new requests without any reset, and two tenants, or two salts of one
tenant, never share a unit.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from execstate.engine.external_prefix import ExternalLoad, ExternalLoadError, ExternalPrefix
from execstate.engine.r3_clock import R3Clock
from execstate.engine.request import Request, RequestStatus
from execstate.identity.execution import ExecutionIdentity, RouteMode
from execstate.identity.keys import BlockKey
from execstate.identity.provenance import Provenance
from execstate.identity.scope import LOCAL_SCOPE, CacheScope
from execstate.state.block_holds import BlockHolds, HeldBlocks
from execstate.state.block_pool import BlockId, BlockPool, NoFreeBlocks
from execstate.state.route_store import RouteStore
from execstate.state.tiers.pool_units import PoolUnits

# Distinct (scope, route mode) identities kept; beyond it the cache starts over (they are cheap).
MAX_CACHED_IDENTITIES = 1024


class BlockEventSink(Protocol):
    """Where ``commit`` reports the blocks it registered (``state/kv_events/recorder.py``'s ``KVEvents``)."""

    def stored(self, keys: Sequence[BlockKey], parent: BlockKey | None, token_ids: Sequence[int],
               weights_version: str, scope: CacheScope) -> None: ...


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(
        self,
        pool: BlockPool,
        block_size: int,
        provenance: Provenance,
        enable_prefix_caching: bool = True,
        route_store: RouteStore | None = None,
        r3_clock: R3Clock | None = None,
        holds: BlockHolds | None = None,
        events: BlockEventSink | None = None,
        pool_units: PoolUnits | None = None,
    ) -> None:
        self.pool = pool
        self.holds = holds if holds is not None else BlockHolds(pool)
        self._block_copies: list[tuple[BlockId, BlockId]] = []  # copy-on-write, (src, dst), for the engine
        self.num_block_copies = 0
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.route_store = route_store
        self.r3_clock = r3_clock or R3Clock()  # times storing route records (the engine's clock)
        self.set_provenance(provenance)
        self.num_lookup_tokens = 0
        self.num_hit_tokens = 0
        self.pool_units = pool_units  # the offload connector's (engine/offload.py), or None
        self.events = events  # the KV events (state/kv_events/recorder.py), or None

    def set_provenance(self, provenance: Provenance) -> None:
        """Re-root every key (weights update, numerics change). Old units stay in the
        pool until evicted but can never match a key computed from here on."""
        self.provenance = provenance
        self._identities: dict[tuple[CacheScope, RouteMode], ExecutionIdentity] = {}

    def identity(self, scope: CacheScope = LOCAL_SCOPE, route_mode: RouteMode = RouteMode.FREE) -> ExecutionIdentity:
        """The execution identity of a sequence in ``scope`` under this engine's provenance."""
        found = self._identities.get((scope, route_mode))
        if found is None:
            if len(self._identities) >= MAX_CACHED_IDENTITIES:
                self._identities.clear()
            found = self._identities[(scope, route_mode)] = ExecutionIdentity(self.provenance, scope, route_mode)
        return found

    def identity_of(self, req: Request) -> ExecutionIdentity:
        """``req``'s identity: its scope, replayed routes when it forces them."""
        mode = RouteMode.FREE if req.params.routed_experts is None else RouteMode.REPLAYED
        return self.identity(req.cache.scope, mode)

    # -- keys ---------------------------------------------------------------
    def update_block_keys(self, req: Request) -> None:
        """Extend ``req.cache.block_keys`` to cover every full block of its known tokens (O(new blocks)
        when there are new full blocks, O(1) otherwise)."""
        if len(req.cache.block_keys) >= req.num_tokens // self.block_size:
            return
        self.identity_of(req).extend(req.cache.block_keys, req.all_token_ids, self.block_size,
                                     forced_routes=req.params.routed_experts)

    # -- admission ----------------------------------------------------------
    def find_cached_prefix(self, req: Request) -> list[BlockId]:
        """Longest run of cached units for the request's prefix (no side effects).

        At most ``(num_tokens - 1) // block_size`` blocks: the last token is always
        computed so the request has logits to sample from.
        """
        if not self.enable_prefix_caching or req.prompt_scoring is not None:
            return []  # prompt logprobs need every position's logits (engine/prompt_logprobs.py)
        self.update_block_keys(req)
        max_blocks = (req.num_tokens - 1) // self.block_size
        hits: list[BlockId] = []
        for key in req.cache.block_keys[:max_blocks]:
            bid = self.pool.lookup(key)
            if bid is None:
                break
            if self.route_store is not None and not self.route_store.has(key):
                break  # fail closed: a unit without its route record is not a hit
            hits.append(bid)
        return hits

    def admit(
        self, req: Request, num_new_tokens: int, external: ExternalPrefix | None = None
    ) -> list[BlockId] | None:
        """Take the request's cached prefix and slots for ``num_new_tokens`` after it.

        Returns the hit blocks (possibly empty), or None if the pool cannot hold the
        request now (nothing changed). On success ``req.num_computed_tokens`` is the
        number of prefix tokens whose KV is in place and their route rows are in
        ``req.routes``.

        With ``external`` (PD decode side), the full blocks after the local hit are
        loaded from another instance into freshly allocated blocks: local units first
        (their rows are this instance's records, never the source's), then the
        verified loaded blocks (rows from the source's records, see
        :meth:`apply_external`), then whatever is left is computed here. The load is
        only started here: the request is then ``WAITING_FOR_REMOTE_KVS`` and holds
        blocks for its whole prompt. When the local hit covers every offered block the
        source is told to release (``skip_load``). A load that cannot start raises
        ``ExternalLoadError`` after releasing everything. A request loads at most once.

        A request that arrives holding blocks (a session step) skips the lookup: see
        :meth:`_admit_held`.
        """
        if req.block_ids:
            return self._admit_held(req, num_new_tokens)
        hits = self.find_cached_prefix(req)
        num_cached = len(hits) * self.block_size
        num_new_tokens = min(num_new_tokens, req.num_tokens - num_cached)
        n_ext = n_offered = 0
        if external is not None and not req.transfer.load_started:
            n_offered = external.num_blocks(req)
            n_ext = max(0, min(n_offered, req.num_tokens // self.block_size) - len(hits))
            if n_ext:  # hold the whole prompt: loaded blocks plus the tail computed here
                num_new_tokens = req.num_tokens - num_cached
        self.pool.acquire(hits)
        need = cdiv(num_cached + num_new_tokens, self.block_size) - len(hits)
        try:
            fresh = self.pool.allocate(need)
        except NoFreeBlocks:
            self.pool.free(list(reversed(hits)))
            return None
        req.block_ids = hits + fresh
        req.num_computed_tokens = num_cached
        req.cache.num_committed_blocks = len(hits)
        self.num_lookup_tokens += req.num_tokens
        self.num_hit_tokens += num_cached
        if self.route_store is not None and hits:
            keys = req.cache.block_keys[: len(hits)]
            new_keys = [k for k in keys if k not in req.cache.leased_keys]
            self.route_store.lease(new_keys)
            req.cache.leased_keys.extend(new_keys)
            assert req.routes is not None
            rows = np.concatenate([self.route_store.get(k) for k in keys])
            req.routes.fill(0, rows)
        if external is not None and n_offered and not req.transfer.load_started:
            req.transfer.load_started = True
            if n_ext:
                self._start_external(req, external, len(hits), n_ext)
            else:
                external.skip_load(req)  # our own cache had every block: the source may free them now
        return hits

    def _admit_held(self, req: Request, num_new_tokens: int) -> list[BlockId] | None:
        """Slots for ``num_new_tokens`` after the held KV; copy-on-write of a partial tail that is
        shared, or committed to the prefix cache as a full block (a session truncated inside it).
        Returns ``[]`` (no prefix hit), or None when the pool is short (nothing changed)."""
        bs = self.block_size
        held = req.num_computed_tokens
        if not 0 < held < req.num_tokens or len(req.block_ids) != cdiv(held, bs):
            raise ValueError(f"held blocks {len(req.block_ids)} do not cover {held} of {req.num_tokens} tokens")
        n = min(num_new_tokens, req.num_tokens - held)
        tail = req.block_ids[-1] if held % bs else None
        committed_tail = tail is not None and req.cache.num_committed_blocks > held // bs
        cow = tail is not None and (self.pool.ref_count(tail) > 1 or committed_tail)
        need = cdiv(held + n, bs) - len(req.block_ids) + int(cow)
        try:
            fresh = self.pool.allocate(need)
        except NoFreeBlocks:
            return None
        if cow:
            assert tail is not None
            copy = fresh.pop(0)
            self._block_copies.append((tail, copy))
            self.num_block_copies += 1
            req.block_ids[-1] = copy
            self.pool.free([tail])  # the other holders (or the prefix cache) keep it, unchanged
            req.cache.num_committed_blocks = min(req.cache.num_committed_blocks, held // bs)  # the copy is not
        req.block_ids.extend(fresh)
        return []

    def take_block_copies(self) -> list[tuple[BlockId, BlockId]]:
        """Copy-on-write copies queued by admissions since the last call, as ``(src, dst)``; the
        engine copies the KV before the forward pass that writes into ``dst``."""
        copies, self._block_copies = self._block_copies, []
        return copies

    def _start_external(self, req: Request, external: ExternalPrefix, first: int, count: int) -> None:
        self.update_block_keys(req)
        keys = req.cache.block_keys[first : first + count]
        try:
            external.start_load(req, first, keys, req.block_ids[first : first + count])
        except ExternalLoadError:
            self.release(req, finished=False)
            raise
        req.status = RequestStatus.WAITING_FOR_REMOTE_KVS

    def apply_external(self, req: Request, loaded: ExternalLoad) -> None:
        """Commit a finished load (``loaded.error`` is None) of a WAITING_FOR_REMOTE_KVS request:
        the verified blocks count as computed, their rows are the source's records, and they are
        registered in the prefix cache now (they are verified; a preemption must not lose them).
        The rest of the prompt is computed here. Fail closed: loaded KV without routes (when this
        instance returns routes) counts as unverified."""
        assert loaded.error is None and req.status is RequestStatus.WAITING_FOR_REMOTE_KVS
        first = req.num_computed_tokens // self.block_size  # admission left the local hit here
        verified = loaded.num_verified_blocks
        if self.route_store is not None and loaded.routes is None:
            verified = 0
        start = first * self.block_size
        end = min((first + verified) * self.block_size, req.num_tokens - 1)
        if end > start:
            if self.route_store is not None:
                assert req.routes is not None and loaded.routes is not None
                req.routes.fill(start, loaded.routes[: end - start])
            req.num_computed_tokens = end
            if loaded.offloaded:
                req.num_offloaded_tokens = end - start
            else:
                req.num_transferred_tokens = end - start
            self.commit(req)

    def allocate(self, req: Request, num_new_tokens: int) -> bool:
        """Reserve slots for ``num_new_tokens`` more tokens of a running request."""
        need = cdiv(req.num_computed_tokens + num_new_tokens, self.block_size) - len(req.block_ids)
        if need <= 0:
            return True
        try:
            req.block_ids.extend(self.pool.allocate(need))
        except NoFreeBlocks:
            return False
        return True

    # -- after a step -------------------------------------------------------
    def commit(self, req: Request) -> None:
        """Register the request's newly completed full blocks as cached units."""
        if not self.enable_prefix_caching:
            return
        num_full = req.num_computed_tokens // self.block_size
        if num_full <= req.cache.num_committed_blocks:
            return
        self.update_block_keys(req)
        bs = self.block_size
        note = self.pool_units is not None and req.params.routed_experts is None
        tokens = req.all_token_ids if note or self.events is not None else []
        registered: list[int] = []
        for i in range(req.cache.num_committed_blocks, num_full):
            key = req.cache.block_keys[i]
            if self.route_store is None:
                if self.pool.commit(req.block_ids[i], key):
                    registered.append(i)
                    if note:
                        self._note_unit(req, i, tokens)
                continue
            assert req.routes is not None
            # The KV block is cached only together with *its* route record. If the store
            # keeps a different record for this key (first writer wins), the block stays
            # private. If another block already holds the key, our fresh record is not
            # paired with KV it did not produce.
            t_r3 = time.perf_counter()
            stored = self.route_store.put(key, req.routes.rows(i * bs, (i + 1) * bs))
            self.r3_clock.add_since(t_r3)
            if not stored:
                continue
            if self.pool.commit(req.block_ids[i], key):
                registered.append(i)
                if note:
                    self._note_unit(req, i, tokens)
            elif self.route_store.lease_count(key) == 0:
                self.route_store.drop(key)
        if self.events is not None and registered:
            self._report_stored(req, registered, tokens)
        req.cache.num_committed_blocks = num_full

    def _report_stored(self, req: Request, registered: list[int], tokens: list[int]) -> None:
        """One ``stored`` event per run of consecutive registered blocks."""
        assert self.events is not None
        bs = self.block_size
        start = 0
        for j in range(1, len(registered) + 1):
            if j < len(registered) and registered[j] == registered[j - 1] + 1:
                continue
            first, last = registered[start], registered[j - 1]
            parent = req.cache.block_keys[first - 1] if first else self.identity_of(req).root
            self.events.stored(req.cache.block_keys[first:last + 1], parent, tokens[first * bs:(last + 1) * bs],
                               self.provenance.weights_version, req.cache.scope)
            start = j

    def _note_unit(self, req: Request, i: int, tokens: list[int]) -> None:
        assert self.pool_units is not None
        bs = self.block_size
        root = self.identity_of(req).root
        parent = req.cache.block_keys[i - 1] if i else root
        self.pool_units.note(req.cache.block_keys[i], parent, root, tokens[i * bs : (i + 1) * bs],
                             self.provenance.weights_version, req.cache.scope.tenant)

    def release(self, req: Request, finished: bool) -> None:
        """Free the request's blocks (tail first). Route leases are kept across a
        preemption (the request still owes those rows) and released when finished.
        A finished ``keep_blocks`` request hands its computed blocks back instead
        (``req.session.returned_blocks``, held in ``self.holds``; None when it computed nothing);
        slots beyond them are freed."""
        if finished and req.session.keep_blocks:
            keep = cdiv(req.num_computed_tokens, self.block_size)
            if len(req.block_ids) > keep:
                self.pool.free(list(reversed(req.block_ids[keep:])))
            if keep:
                req.session.returned_blocks = self.holds.adopt(HeldBlocks(
                    req.block_ids[:keep], req.num_computed_tokens, list(req.cache.block_keys),
                    min(req.cache.num_committed_blocks, keep)))
        elif req.block_ids:
            self.pool.free(list(reversed(req.block_ids)))
        req.block_ids = []
        req.cache.num_committed_blocks = 0
        req.num_computed_tokens = 0
        if finished and self.route_store is not None and req.cache.leased_keys:
            self.route_store.release(req.cache.leased_keys)
            req.cache.leased_keys = []

    @property
    def prefix_hit_rate(self) -> float:
        return self.num_hit_tokens / self.num_lookup_tokens if self.num_lookup_tokens else 0.0

"""Prefill/decode disaggregation wired into one engine (docs/contracts.md 5).

Roles (vLLM's names): ``kv_producer`` (prefill), ``kv_consumer`` (decode), ``kv_both``.

Producer: a request carrying ``kv_transfer_params={"do_remote_decode": True}`` runs its
prefill (the proxy asks for one token); when it finishes, its full prompt blocks are
exported — pinned in the pool, snapshotted with keys, checksums and route records —
and its output carries the handoff parameters for the decode side. The blocks stay
pinned until the decode side releases them or the TTL passes.

Consumer: a request carrying the producer's handoff parameters is accepted only if the
producer signed them or names an allow-listed producer (``transfer/handoff.py``; checked by
``LLMEngine.add_request`` and, over HTTP, before the request reaches the engine). It is
admitted through ``KVCacheManager.admit(external=self.loads)``: the local prefix cache is
consulted first (those rows are this instance's records); if it covers every offered block the
producer is told to release at once; otherwise the remaining full blocks are read from the
producer over NIXL into freshly allocated blocks **on the transfer thread**
(``transfer/load_worker.py``) and verified there (identity, keys this engine computed itself,
per-block checksums) while the engine keeps stepping the other requests; the request waits in
WAITING_FOR_REMOTE_KVS and is committed between steps (``engine/pd_loads.py``: failure policy,
fenced blocks, limits). Loaded rows are the producer's records. The last prompt token is always
recomputed here.

Construction (``LLMEngine.__init__``, from ``EngineConfig.kv_transfer``, with the engine's other KV
connectors): the connector is given the engine's parts it works on,
never the engine: the KV pool and block pool (exports pin blocks, loads fill them), the KV cache
manager (block keys of an export; the current provenance for the handshake), the route shape
(``(n_moe_layers, top_k)`` when the engine returns routes), ``wake`` (the transfer thread ends an
idle step's wait when a load finishes) and ``make_importer`` (how the transfer thread's
importer is built: :class:`~execstate.transfer.importer.KVImporter` unless the caller passes
another, e.g. a fault-injecting one in tests and ``execstate bench pd``) and ``on_transfer`` (told
of every finished load: the metrics hook). The engine gives ``loads`` to its scheduler as the
external prefix source at the scheduler's construction and calls ``on_weights_updated`` after a
weight switch.

Threads: the engine thread calls every method; the control server's thread reads the
exporter's immutable snapshots; the transfer thread owns the importer and reads through NIXL.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from execstate.engine.kv_cache_manager import KVCacheManager
from execstate.engine.pd_config import ImporterFactory, PDConfig, TransferObserver
from execstate.engine.pd_loads import LoadStats, RemoteLoads
from execstate.engine.request import Request
from execstate.identity.keys import BlockKey
from execstate.identity.secret_ring import SecretRing
from execstate.state.block_pool import BlockId, BlockPool
from execstate.state.kv_pool import KVPool
from execstate.transfer.bulk import NixlBulk
from execstate.transfer.checks import kv_layout_of
from execstate.transfer.control import ControlServer, Release
from execstate.transfer.errors import TransferError
from execstate.transfer.exporter import KVExporter
from execstate.transfer.handoff import Handoff, HandoffTrust
from execstate.transfer.importer import KVImporter
from execstate.transfer.load_worker import LoadWorker
from execstate.transfer.manifest import FORMAT_VERSION, Capabilities, R3Format

__all__ = ["ImporterFactory", "PDConfig", "PDConnector", "TransferObserver", "TransferStats"]


@dataclass
class TransferStats(LoadStats):
    exports: int = 0
    export_failures: int = 0


class PDConnector:
    """One engine's PD connector (module docstring: roles, construction, threads)."""

    def __init__(self, cfg: PDConfig, *, kv_pool: KVPool, block_pool: BlockPool, kv_manager: KVCacheManager,
                 route_shape: tuple[int, int] | None, wake: Callable[[], None],
                 make_importer: ImporterFactory | None = None, on_transfer: TransferObserver | None = None) -> None:
        self.cfg = cfg
        self.kv_pool = kv_pool
        self.block_size = kv_pool.block_size
        self._kv_manager = kv_manager
        self._route_shape = route_shape
        self.instance_id = cfg.engine_id or f"execstate-{uuid.uuid4().hex[:12]}"
        self.stats = TransferStats()
        # The shared secret of server-to-server messages: the current one signs, the previous ones
        # (a rotation: identity/secret_ring.py) verify too; None: handoffs unsigned, no migration.
        self.secrets = SecretRing.resolve(cfg.secret, cfg.previous_secrets)
        # Thread-safe and immutable: the HTTP layer checks handoffs with it before the engine sees them.
        self.trust = HandoffTrust(self.secrets, dict(cfg.allowed_prefill or {}), self.block_size)
        self.bulk = NixlBulk(kv_pool, self.instance_id, timeout_s=cfg.timeout_s)
        self.exporter: KVExporter | None = None
        self.server: ControlServer | None = None
        self.loads: RemoteLoads | None = None
        caps = self.capabilities()
        if cfg.role in ("kv_producer", "kv_both"):
            self.exporter = KVExporter(kv_pool, block_pool, caps, self.bulk, cfg.max_inflight, cfg.max_bytes, cfg.ttl_s)
            self.server = ControlServer(cfg.host, cfg.port, self.exporter)
        if cfg.role in ("kv_consumer", "kv_both"):
            # map the pool's pages now, in the background, so loads do not pay page faults inside
            # the copy (transfer/bulk.py: 20-70x the copy) while the engine serves
            kv_pool.populate_async()
            importer = (make_importer or KVImporter)(kv_pool, caps, self.bulk, cfg.timeout_s)
            worker = LoadWorker(importer, self.bulk, on_result=wake)
            max_fenced = cfg.max_fenced_blocks or max(1, block_pool.num_blocks // 4)
            self.loads = RemoteLoads(worker, block_pool, self.block_size, route_shape is not None,
                                     cfg.failure_policy, cfg.max_inflight, max_fenced, self.stats)
            self.loads.on_transfer = on_transfer

    @property
    def is_consumer(self) -> bool:
        return self.loads is not None

    @property
    def exports(self) -> bool:
        """Whether it exports blocks (role ``kv_producer`` or ``kv_both``: an exporter and its
        control server)."""
        return self.exporter is not None and self.server is not None

    @property
    def importer(self) -> KVImporter | None:
        """The transfer thread's importer (tests replace its methods while no load runs)."""
        return self.loads.worker.importer if self.loads is not None else None

    @property
    def on_transfer(self) -> TransferObserver | None:
        """Called after every load with (kv_bytes, ok, control_bytes, seconds): the metrics hook."""
        return self.loads.on_transfer if self.loads is not None else None

    @property
    def fenced_blocks(self) -> list[BlockId]:
        """Blocks an uncancellable NIXL read may still write: out of the pool until it ends."""
        return self.loads.fenced_blocks if self.loads is not None else []

    def capabilities(self) -> Capabilities:
        r3 = None
        if self._route_shape is not None and self.cfg.routes_transfer:
            n_moe_layers, top_k = self._route_shape
            r3 = R3Format(n_moe_layers=n_moe_layers, top_k=top_k)
        return Capabilities(
            format_version=FORMAT_VERSION,
            instance_id=self.instance_id,
            provenance_digest=self._kv_manager.provenance.digest(),
            kv_layout=kv_layout_of(self.kv_pool),
            r3=r3,
        )

    # -- producer -----------------------------------------------------------------
    @staticmethod
    def wants_export(req: Request) -> bool:
        return bool(req.transfer.params and req.transfer.params.get("do_remote_decode"))

    def export(self, req: Request) -> dict[str, Any]:
        """Export the finished prefill's full prompt blocks; returns the handoff params.

        Raises TransferError (e.g. over the in-flight limits): a request-level error.
        """
        assert self.exporter is not None and self.server is not None, "export() on a non-producer"
        bs = self.block_size
        n_full = req.num_prompt_tokens // bs
        if n_full == 0:  # nothing to hand off: D computes the whole prompt
            return {"do_remote_prefill": False, "do_remote_decode": False, "remote_engine_id": self.instance_id}
        self._kv_manager.update_block_keys(req)
        routes = None
        if req.routes is not None and self.cfg.routes_transfer:
            routes = req.routes.rows(0, n_full * bs)
        handoff = self.export_blocks(req.block_ids[:n_full], req.cache.block_keys[:n_full], routes)
        return handoff.to_params(self.secrets)

    def export_blocks(self, block_ids: list[BlockId], keys: list[BlockKey], routes: np.ndarray | None) -> Handoff:
        """Export full blocks (pinned until released or the TTL) under a fresh transfer id; the
        unsigned handoff naming them (``to_params(self.secrets)`` signs it). ``routes``: their rows,
        or None (sent only when this instance transfers routes). Raises TransferError (limits)."""
        assert self.exporter is not None and self.server is not None, "export on a non-producer"
        if not self.cfg.routes_transfer:
            routes = None
        transfer_id = f"{self.instance_id}/{uuid.uuid4().hex}"
        bs = self.block_size
        try:
            self.exporter.export(transfer_id, self.exporter.epoch, block_ids, keys, routes, len(block_ids) * bs)
        except TransferError:
            self.stats.export_failures += 1
            raise
        self.stats.exports += 1
        return Handoff(
            remote_engine_id=self.instance_id,
            remote_addr=self.server.addr,
            transfer_id=transfer_id,
            epoch=self.exporter.epoch,
            num_blocks=len(block_ids),
            block_size=bs,
            expires_at=int(time.time() + self.cfg.ttl_s),
        )

    def release_export(self, transfer_id: str) -> None:
        """Drop an export's pins now (the receiver may not have released it; idempotent)."""
        if self.exporter is not None:
            self.exporter.on_release(Release(transfer_id))
            self.exporter.poll()

    def poll(self) -> None:
        """Between steps and while idle: drop released/expired exports, take finished loads and
        reclaimed fences from the transfer thread."""
        if self.exporter is not None:
            self.exporter.poll()
        if self.loads is not None:
            self.loads.poll()

    @property
    def num_loads_inflight(self) -> int:
        """Loads queued or running on the transfer thread (requests' and owned ones)."""
        return self.loads.num_inflight if self.loads is not None else 0

    @property
    def num_pinned_exports(self) -> int:
        return self.exporter.num_inflight if self.exporter is not None else 0

    @property
    def needs_polling(self) -> bool:
        """Housekeeping pending: pinned exports (TTL), loads in flight, fenced blocks."""
        loads = self.loads
        return self.num_pinned_exports > 0 or (
            loads is not None and (loads.num_inflight > 0 or bool(loads.fenced_blocks))
        )

    @property
    def has_finished_loads(self) -> bool:
        return self.loads is not None and self.loads.has_finished

    def accept_handoff(self, params: Mapping[str, Any]) -> Handoff:
        """The trusted handoff of ``params`` or ``HandoffError`` (a ``ValueError``)."""
        return self.trust.accept(params)

    def on_weights_updated(self) -> None:
        """New weights: no old export may be served, and the handshake identity changes."""
        caps = self.capabilities()
        if self.exporter is not None:
            self.exporter.invalidate_all()
            self.exporter.caps = caps
        if self.loads is not None:
            self.loads.worker.set_caps(caps)

    def close(self) -> None:
        """Stop the control server and the transfer thread (a load in progress finishes first)."""
        if self.server is not None:
            self.server.close()
        if self.loads is not None:
            self.loads.worker.close()
        self.bulk.close()

"""Prefill/decode disaggregation wired into one engine (docs/ARCHITECTURE.md 5).

Roles (vLLM's names): ``kv_producer`` (prefill), ``kv_consumer`` (decode), ``kv_both``.

Producer: a request carrying ``kv_transfer_params={"do_remote_decode": True}`` runs its
prefill (the proxy asks for one token); when it finishes, its full prompt blocks are
exported — pinned in the pool, snapshotted with keys, checksums and route records —
and its output carries the handoff parameters for the decode side. The blocks stay
pinned until the decode side releases them or the TTL passes.

Consumer: a request carrying the producer's handoff parameters is admitted through
``KVCacheManager.admit(external=self)``: the local prefix cache is consulted first
(those rows are this instance's records), then the remaining full blocks are read from
the producer over NIXL into freshly allocated blocks and verified (identity, keys this
engine computed itself, per-block checksums) before anything is used; their rows are
the producer's records. The last prompt token is always recomputed here. On a failed
or partial load, policy ``fail`` finishes the request with an error (the engine stays
healthy) and ``recompute`` computes the unverified ranges here (those rows are ours).

All methods run on the engine thread; only the control server's thread reads the
exporter's immutable snapshots.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from execstate.engine.kv_cache_manager import ExternalLoad, ExternalLoadError
from execstate.engine.request import Request
from execstate.identity.keys import BlockKey
from execstate.state.block_pool import BlockId
from execstate.transfer.bulk import NixlBulk
from execstate.transfer.checks import kv_layout_of
from execstate.transfer.control import ControlServer
from execstate.transfer.errors import TransferError
from execstate.transfer.exporter import KVExporter
from execstate.transfer.faults import FaultInjection
from execstate.transfer.importer import KVImporter
from execstate.transfer.manifest import FORMAT_VERSION, Capabilities, R3Format

if TYPE_CHECKING:
    from execstate.engine.llm_engine import LLMEngine

ROLES = ("kv_producer", "kv_consumer", "kv_both")
POLICIES = ("fail", "recompute")


@dataclass
class PDConfig:
    role: str
    failure_policy: str = "fail"
    routes_transfer: bool = True
    engine_id: str | None = None
    host: str = "127.0.0.1"
    port: int = 0
    max_inflight: int = 64
    max_bytes: int = 1 << 30
    ttl_s: float = 60.0
    timeout_s: float = 10.0
    faults: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"kv_role must be one of {ROLES}, got {self.role!r}")
        if self.failure_policy not in POLICIES:
            raise ValueError(f"kv_load_failure_policy must be one of {POLICIES}, got {self.failure_policy!r}")


@dataclass
class TransferStats:
    loads: int = 0
    failures: int = 0
    kv_bytes: int = 0
    control_bytes: int = 0
    exports: int = 0
    export_failures: int = 0
    load_seconds: float = 0.0  # total wall time spent in loads


class PDConnector:
    def __init__(self, engine: LLMEngine, cfg: PDConfig) -> None:
        self.engine = engine
        self.cfg = cfg
        self.instance_id = cfg.engine_id or f"execstate-{uuid.uuid4().hex[:12]}"
        self.stats = TransferStats()
        # Blocks a stuck (uncancellable) NIXL read may still write: never reused.
        self.fenced_blocks: list[BlockId] = []
        # Called after every load with (kv_bytes, ok, control_bytes, seconds): the server's metrics hook.
        self.on_transfer: Callable[[int, bool, int, float], None] | None = None
        self.bulk = NixlBulk(engine.kv_pool, self.instance_id, timeout_s=cfg.timeout_s)
        self.exporter: KVExporter | None = None
        self.server: ControlServer | None = None
        self.importer: KVImporter | None = None
        caps = self.capabilities()
        if cfg.role in ("kv_producer", "kv_both"):
            self.exporter = KVExporter(
                engine.kv_pool, engine.block_pool, caps, self.bulk, cfg.max_inflight, cfg.max_bytes, cfg.ttl_s
            )
            self.server = ControlServer(cfg.host, cfg.port, self.exporter)
        if cfg.role in ("kv_consumer", "kv_both"):
            faults = FaultInjection.from_dict(cfg.faults) if cfg.faults else None
            self.importer = KVImporter(engine.kv_pool, caps, self.bulk, cfg.timeout_s, faults)
            engine.scheduler.external = self

    def capabilities(self) -> Capabilities:
        e = self.engine
        r3 = None
        if e.return_routes and self.cfg.routes_transfer:
            r3 = R3Format(n_moe_layers=e.model_config.num_moe_layers, top_k=e.model_config.top_k)
        return Capabilities(
            format_version=FORMAT_VERSION,
            instance_id=self.instance_id,
            provenance_digest=e.provenance.digest(),
            kv_layout=kv_layout_of(e.kv_pool),
            r3=r3,
        )

    # -- producer -----------------------------------------------------------------
    @staticmethod
    def wants_export(req: Request) -> bool:
        return bool(req.kv_transfer_params and req.kv_transfer_params.get("do_remote_decode"))

    def export(self, req: Request) -> dict[str, Any]:
        """Export the finished prefill's full prompt blocks; returns the handoff params.

        Raises TransferError (e.g. over the in-flight limits): a request-level error.
        """
        assert self.exporter is not None and self.server is not None, "export() on a non-producer"
        e = self.engine
        bs = e.block_size
        n_full = req.num_prompt_tokens // bs
        params: dict[str, Any] = {
            "do_remote_prefill": n_full > 0,
            "do_remote_decode": False,
            "remote_engine_id": self.instance_id,
            "remote_addr": self.server.addr,
            "num_blocks": n_full,
            "block_size": bs,
        }
        if n_full == 0:
            return params
        e.kv_manager.update_block_keys(req)
        routes = None
        if req.routes is not None and self.cfg.routes_transfer:
            routes = req.routes.rows(0, n_full * bs)
        transfer_id = f"{self.instance_id}/{uuid.uuid4().hex}"
        try:
            self.exporter.export(
                transfer_id, self.exporter.epoch, req.block_ids[:n_full], req.block_keys[:n_full], routes, n_full * bs
            )
        except TransferError:
            self.stats.export_failures += 1
            raise
        self.stats.exports += 1
        params.update(transfer_id=transfer_id, epoch=self.exporter.epoch)
        return params

    def poll(self) -> None:
        if self.exporter is not None:
            self.exporter.poll()

    @property
    def num_pinned_exports(self) -> int:
        return self.exporter.num_inflight if self.exporter is not None else 0

    def on_weights_updated(self) -> None:
        """New weights: no old export may be served, and the handshake identity changes."""
        caps = self.capabilities()
        if self.exporter is not None:
            self.exporter.invalidate_all()
            self.exporter.caps = caps
        if self.importer is not None:
            self.importer.caps = caps

    # -- consumer (ExternalPrefix) -------------------------------------------------
    def num_blocks(self, req: Request) -> int:
        p = req.kv_transfer_params
        if not p or not p.get("do_remote_prefill"):
            return 0
        n = p.get("num_blocks")
        if not isinstance(n, int) or n < 0 or p.get("block_size") != self.engine.block_size:
            raise ExternalLoadError(f"invalid kv_transfer_params: num_blocks={n!r} block_size={p.get('block_size')!r}")
        return n

    def load(self, req: Request, first_block: int, keys: list[BlockKey], dst: list[BlockId]) -> ExternalLoad:
        assert self.importer is not None
        p = req.kv_transfer_params or {}
        addr, tid, epoch = p.get("remote_addr"), p.get("transfer_id"), p.get("epoch")
        if not isinstance(addr, str) or not isinstance(tid, str) or not isinstance(epoch, int):
            return self._failed(f"invalid kv_transfer_params (remote_addr/transfer_id/epoch): {p!r}")
        t0 = time.perf_counter()
        stuck_before = self.bulk.num_stuck
        res = self.importer.load(addr, tid, epoch, keys, dst, self.engine.return_routes, start_block=first_block)
        if self.bulk.num_stuck > stuck_before:
            # A read NIXL could not cancel may still write into ``dst``: fence those blocks
            # for good (an extra reference nobody releases) and fail the request whatever
            # the policy, since recomputing into them could be overwritten later.
            self.engine.block_pool.acquire(dst)
            self.fenced_blocks.extend(dst)
            self.stats.failures += 1
            raise ExternalLoadError(f"KV load from {addr}: a timed-out read could not be cancelled; "
                                    f"{len(dst)} blocks fenced")
        self.stats.loads += 1
        self.stats.kv_bytes += res.kv_bytes
        self.stats.control_bytes += res.control_bytes
        self.stats.load_seconds += time.perf_counter() - t0
        req.transfer_info = {"kv_bytes": res.kv_bytes, "control_bytes": res.control_bytes, "seconds": res.elapsed_s}
        if self.on_transfer is not None:
            self.on_transfer(res.kv_bytes, res.ok, res.control_bytes, res.elapsed_s)
        if not res.ok:
            self._failed(f"KV load from {addr} failed: {res.error}")
        return ExternalLoad(res.num_blocks_verified, res.routes)

    def _failed(self, message: str) -> ExternalLoad:
        """Policy ``fail``: raise (request-level error). ``recompute``: nothing verified
        beyond what the caller reports; the rest is computed here."""
        self.stats.failures += 1
        if self.cfg.failure_policy == "fail":
            raise ExternalLoadError(message)
        return ExternalLoad(0, None)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        if self.importer is not None:
            self.importer.close()
        self.bulk.close()

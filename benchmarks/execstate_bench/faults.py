"""Fault injection for the transfer path: an importer that injects faults, for the benchmarks and
the tests (it lives in the benchmarks' distribution, which the runtime never imports; ``lint-imports``
checks that).

No production configuration reaches this module: the server's ``kv_connector_extra_config`` has
no fault key, and :class:`~execstate.transfer.importer.KVImporter` injects nothing. Tests build a
:class:`FaultyImporter` directly, or make a decode instance build one instead of the real importer
through the connector's seam: ``LLMEngine(EngineConfig(..., kv_transfer=cfg), make_importer=importer_factory(faults))``
(in-process: the engine tests, the session migration tests, ``execstate bench sessions``), or, in
a server process, through the launcher ``python -m execstate_bench.faulty_serve`` (the HTTP tests
and ``execstate bench pd``).

Configured from a dict such as ``{"mode": "corrupt", "every_n": 2}`` (:meth:`FaultInjection.from_dict`).
The fault fires on every ``every_n``-th load of an importer (1-based count). Modes:

- ``drop``: the manifest reply is discarded on arrival; the load times out.
- ``delay``: the manifest reply is held ``delay_s`` before it is read; beyond the importer's
  timeout the load fails as a timeout, below it the load succeeds late.
- ``corrupt``: one byte of a received block (``corrupt_block``-th loaded block, default the middle
  one) is flipped before verification; that block and every later one are unverified.
- ``truncate``: the received manifest loses its last block (``truncate="blocks"``) or the last
  byte of its first route record (``truncate="routes"``) before verification.
- ``duplicate``: after a complete load (and its ``Release``) the same transfer is loaded again;
  the second load's result is returned and must fail (released).
- ``stale_transfer_id``: the importer requests ``stale_id`` (default: the id of its previous
  load) instead of the id it was given.
- ``kill_source``: nothing on the importer; the harness kills the exporter's process.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from enum import Enum
from typing import Any

import msgspec
import torch

from execstate.engine.pd_connector import ImporterFactory
from execstate.state.kv_pool import KVPool
from execstate.transfer.bulk import NixlBulk
from execstate.transfer.control import ControlClient, ReplyFilter
from execstate.transfer.importer import KVImporter, LoadRequest, LoadResult
from execstate.transfer.manifest import Capabilities, Manifest


class FaultMode(Enum):
    DROP = "drop"
    CORRUPT = "corrupt"
    TRUNCATE = "truncate"
    DELAY = "delay"
    DUPLICATE = "duplicate"
    STALE_TRANSFER_ID = "stale_transfer_id"
    KILL_SOURCE = "kill_source"


class TruncateTarget(Enum):
    BLOCKS = "blocks"
    ROUTES = "routes"


@dataclass(frozen=True, slots=True)
class FaultInjection:
    """Immutable fault configuration; ``mode=None`` (the default) injects nothing."""

    mode: FaultMode | None = None
    delay_s: float = 0.5
    every_n: int = 1
    truncate: TruncateTarget = TruncateTarget.BLOCKS
    stale_id: str | None = None
    corrupt_block: int | None = None

    def __post_init__(self) -> None:
        if self.every_n < 1:
            raise ValueError(f"every_n must be >= 1, got {self.every_n}")
        if self.delay_s < 0:
            raise ValueError(f"delay_s must be >= 0, got {self.delay_s}")

    @classmethod
    def from_dict(cls, config: Mapping[str, Any] | None) -> FaultInjection:  # JSON values
        """Parse ``{"mode": ..., "delay_s": ..., "every_n": ..., ...}``; ``None`` or ``{}`` is off.

        Unknown keys or values raise ``ValueError``.
        """
        if not config:
            return cls()
        unknown = set(config) - {"mode", "delay_s", "every_n", "truncate", "stale_id", "corrupt_block"}
        if unknown:
            raise ValueError(f"unknown fault options {sorted(unknown)}")
        mode = config.get("mode")
        return cls(
            mode=None if mode is None else FaultMode(mode),
            delay_s=float(config.get("delay_s", 0.5)),
            every_n=int(config.get("every_n", 1)),
            truncate=TruncateTarget(config.get("truncate", "blocks")),
            stale_id=None if config.get("stale_id") is None else str(config["stale_id"]),
            corrupt_block=None if config.get("corrupt_block") is None else int(config["corrupt_block"]),
        )

    def active(self, load_number: int) -> FaultMode | None:
        """The fault injected into the ``load_number``-th load (1-based), ``None`` for none."""
        return self.mode if load_number % self.every_n == 0 else None


def reply_filter(mode: FaultMode, delay_s: float) -> ReplyFilter | None:
    """The control-client reply filter of ``drop`` / ``delay``; ``None`` for other modes."""
    if mode is FaultMode.DROP:
        return lambda raw: None
    if mode is FaultMode.DELAY:

        def delayed(raw: bytes) -> bytes:
            time.sleep(delay_s)
            return raw

        return delayed
    return None


def truncate_manifest(manifest: Manifest, target: TruncateTarget) -> Manifest:
    """A copy of ``manifest`` with its last block dropped, or its first route record one byte short."""
    if target is TruncateTarget.BLOCKS:
        return msgspec.structs.replace(
            manifest, blocks=manifest.blocks[:-1], block_addrs=manifest.block_addrs[:-1]
        )
    first = manifest.blocks[0]
    if first.routes is None:
        raise ValueError("truncate=routes needs a manifest that carries routes")
    blocks = [msgspec.structs.replace(first, routes=first.routes[:-1]), *manifest.blocks[1:]]
    return msgspec.structs.replace(manifest, blocks=blocks)


def corrupt_block(pool: KVPool, block_id: int) -> None:
    """Flip every bit of one byte in the last layer's V region of ``block_id`` (in place)."""
    row = pool.v[pool.num_layers - 1, block_id * pool.block_size + pool.block_size // 2]
    raw = row.reshape(-1).view(torch.uint8)
    raw[3] ^= 0xFF


class FaultyImporter(KVImporter):
    """A :class:`KVImporter` that injects ``faults`` (a test double; same thread rules)."""

    def __init__(
        self,
        pool: KVPool,
        caps: Capabilities,
        bulk: NixlBulk,
        timeout_s: float,
        faults: FaultInjection | None = None,
        hash_executor: Executor | None = None,
    ) -> None:
        super().__init__(pool, caps, bulk, timeout_s, hash_executor)
        self.faults = faults or FaultInjection()
        self._loads = 0
        self._fault: FaultMode | None = None
        self._last_transfer_id: str | None = None

    def load(self, remote_addr: str, transfer_id: str, *args: Any, **kwargs: Any) -> LoadResult:
        self._loads += 1
        self._fault = self.faults.active(self._loads)
        try:
            result = super().load(remote_addr, transfer_id, *args, **kwargs)
            if self._fault is FaultMode.DUPLICATE and result.ok:
                self._fault = None
                result = super().load(remote_addr, transfer_id, *args, **kwargs)  # delivered twice
        finally:
            self._fault = None
            self._last_transfer_id = transfer_id
        return result

    def _fetch_manifest(self, client: ControlClient, req: LoadRequest) -> Manifest:
        fault = self._fault
        tid = req.transfer_id
        if fault is FaultMode.STALE_TRANSFER_ID:
            tid = self.faults.stale_id or self._last_transfer_id or f"{tid}~stale"
        flt = None if fault is None else reply_filter(fault, self.faults.delay_s)
        manifest = client.get_manifest(tid, req.epoch, flt)
        if fault is FaultMode.TRUNCATE:
            manifest = truncate_manifest(manifest, self.faults.truncate)
        return manifest

    def _received(self, req: LoadRequest) -> None:
        if self._fault is FaultMode.CORRUPT:
            j = len(req.keys) // 2 if self.faults.corrupt_block is None else self.faults.corrupt_block
            corrupt_block(self.pool, int(req.dst[j]))


def importer_factory(faults: FaultInjection) -> ImporterFactory:
    """The connector's ``make_importer`` (``engine/pd_connector.py``) that builds a :class:`FaultyImporter`."""

    def make(pool: KVPool, caps: Capabilities, bulk: NixlBulk, timeout_s: float) -> KVImporter:
        return FaultyImporter(pool, caps, bulk, timeout_s, faults=faults)

    return make

"""The PD connector's configuration (``EngineConfig.kv_transfer``; the engine builds the connector
at construction): what the serving layer builds from ``--kv-transfer-config`` (docs/contracts.md 5). Importing it loads
no transfer machinery (NIXL is imported only when a connector is built)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from execstate.transfer.handoff import check_allow_list

if TYPE_CHECKING:
    from execstate.state.kv_pool import KVPool
    from execstate.transfer.bulk import NixlBulk
    from execstate.transfer.importer import KVImporter
    from execstate.transfer.manifest import Capabilities

ROLES = ("kv_producer", "kv_consumer", "kv_both")
POLICIES = ("fail", "recompute")


@dataclass
class PDConfig:
    """``secret``: the handoff HMAC key shared by P, D and the proxy (``None``: from
    ``$EXECSTATE_KV_SECRET``, else unsigned handoffs); ``previous_secrets``: still accepted during
    a rotation (``None``: from ``$EXECSTATE_KV_SECRET_PREVIOUS``, comma-separated). ``allowed_prefill``: producer
    engine id ->
    control address D may load from without a signature. ``ttl_s``: how long P keeps an export
    pinned when D never releases it (also the handoff's expiry). ``max_fenced_blocks``: ``None``
    = a quarter of the KV pool."""

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
    secret: str | None = None
    previous_secrets: list[str] | None = None
    allowed_prefill: Mapping[str, str] | None = None
    max_fenced_blocks: int | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"kv_role must be one of {ROLES}, got {self.role!r}")
        if self.failure_policy not in POLICIES:
            raise ValueError(f"kv_load_failure_policy must be one of {POLICIES}, got {self.failure_policy!r}")
        self.allowed_prefill = check_allow_list(self.allowed_prefill)
        if self.max_fenced_blocks is not None and self.max_fenced_blocks < 1:
            raise ValueError(f"max_fenced_blocks must be >= 1, got {self.max_fenced_blocks}")


# Builds the transfer thread's importer: (kv pool, capabilities, bulk channel, timeout_s) -> importer.
ImporterFactory = Callable[["KVPool", "Capabilities", "NixlBulk", float], "KVImporter"]
# Told of every finished load (a consumer's): (kv_bytes, ok, control_bytes, seconds); the metrics hook.
TransferObserver = Callable[[int, bool, int, float], None]

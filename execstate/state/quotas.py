"""Per-tenant quotas on long-lived state (docs/security.md). Pure Python, no locks (one owner thread).

Every tenant has limits on what it may keep resident: ``sessions`` (LM sessions), ``checkpoints``,
``pinned_blocks`` (KV blocks held by its sessions and checkpoints), ``agents`` and
``world_sessions``. ``None`` is "unlimited". A :class:`QuotaLedger` holds the limits and answers
two ways:

- ``check(tenant, kind, held, asked)``: where the owner of the state can count what a tenant
  holds from the state itself (the session manager counts its resident sessions, checkpoints
  and pinned blocks: ``session/runtime/manager.py``), it passes that count; nothing is kept here
  that could drift from the state;
- ``reserve`` / ``release``: where nothing else counts it, the ledger does; the code that creates
  such state calls ``reserve`` first (a refusal changes nothing) and ``release`` exactly once
  when the state goes (close, expiry, eviction, disconnect, error).

Contract:

- ``check(tenant, kind, held, asked)`` raises :class:`QuotaExceeded` when ``held + asked`` is over
  the tenant's limit; it counts nothing.
- ``reserve(tenant, kind, n)`` raises :class:`QuotaExceeded` (``code`` ``quota``, naming the kind,
  the limit and the tenant) when the tenant would hold more than its limit; nothing is counted.
- ``release(tenant, kind, n)`` never lets a count go below zero (``ValueError``: a double release is
  a bug, found here rather than as a slowly leaking quota).
- ``usage()`` is what ``/metrics`` shows per tenant (tenant names, never keys).
- ``check_integrity()``: every count is >= 0 and no tenant holds more than its limit.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, fields

from execstate.identity.tenant import TenantId

KINDS = ("sessions", "checkpoints", "pinned_blocks", "agents", "world_sessions")


@dataclass(frozen=True)
class Quotas:
    """Limits per tenant (``None``: unlimited)."""

    sessions: int | None = None
    checkpoints: int | None = None
    pinned_blocks: int | None = None
    agents: int | None = None
    world_sessions: int | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ValueError(f"quota {f.name} must be an integer >= 0 or None, got {v!r}")

    def limit(self, kind: str) -> int | None:
        if kind not in KINDS:
            raise ValueError(f"unknown quota kind {kind!r}; kinds: {', '.join(KINDS)}")
        limit: int | None = getattr(self, kind)
        return limit


class QuotaExceeded(Exception):
    code = "quota"

    def __init__(self, tenant: TenantId, kind: str, limit: int, held: int, asked: int) -> None:
        self.tenant, self.kind, self.limit = tenant, kind, limit
        self.message = (f"tenant {tenant!r} holds {held} {kind.replace('_', ' ')} of its quota of {limit}; "
                        f"{asked} more would exceed it (release some, or raise --tenant-max-{kind.replace('_', '-')})")
        super().__init__(self.message)


class QuotaLedger:
    def __init__(self, quotas: Quotas | None = None, per_tenant: dict[TenantId, Quotas] | None = None) -> None:
        self.quotas = quotas or Quotas()
        self.per_tenant = dict(per_tenant or {})
        self._held: dict[TenantId, dict[str, int]] = defaultdict(lambda: dict.fromkeys(KINDS, 0))

    def limits(self, tenant: TenantId) -> Quotas:
        return self.per_tenant.get(tenant, self.quotas)

    def held(self, tenant: TenantId, kind: str) -> int:
        self.quotas.limit(kind)  # validates kind
        return self._held[tenant][kind] if tenant in self._held else 0

    def check(self, tenant: TenantId, kind: str, held: int, asked: int = 1) -> None:
        """:class:`QuotaExceeded` unless ``tenant``, holding ``held``, may take ``asked`` more ``kind``."""
        limit = self.limits(tenant).limit(kind)
        if limit is not None and held + asked > limit:
            raise QuotaExceeded(tenant, kind, limit, held, asked)

    def reserve(self, tenant: TenantId, kind: str, n: int = 1) -> None:
        limit = self.limits(tenant).limit(kind)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"a reservation is an integer >= 0, got {n!r}")
        held = self.held(tenant, kind)
        if limit is not None and held + n > limit:
            raise QuotaExceeded(tenant, kind, limit, held, n)
        self._held[tenant][kind] = held + n

    def release(self, tenant: TenantId, kind: str, n: int = 1) -> None:
        held = self.held(tenant, kind)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0 or n > held:
            raise ValueError(f"release of {n!r} {kind} for tenant {tenant!r}, which holds {held}")
        self._held[tenant][kind] = held - n
        if not any(self._held[tenant].values()):
            del self._held[tenant]

    def usage(self) -> dict[TenantId, dict[str, int]]:
        return {t: dict(c) for t, c in self._held.items()}

    def check_integrity(self) -> None:
        for tenant, counts in self._held.items():
            limits = self.limits(tenant)
            for kind, n in counts.items():
                assert n >= 0, (tenant, kind, n)
                limit = limits.limit(kind)
                assert limit is None or n <= limit, (tenant, kind, n, limit)

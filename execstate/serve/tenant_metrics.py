"""Per-tenant gauges in ``/metrics``: what each tenant holds (docs/security.md; docs/contracts.md 9).

Labelled with tenant names (``identity/tenant.py``), never keys; ``/metrics`` needs no key. Set
from a snapshot taken at scrape time (the LM sessions' on the engine thread, the world sessions'
under their lock): a tenant that holds nothing has no series.

=====================================================  ============================================
``execstate_tenant_sessions{tenant}``                  resident LM sessions (the session API's realm)
``execstate_tenant_agents{tenant}``                    live agents (``/v1/realtime/agent``)
``execstate_tenant_world_sessions{tenant}``            resident world sessions
``execstate_tenant_checkpoints{tenant}``               live checkpoints of its LM sessions
``execstate_tenant_pinned_kv_blocks{tenant}``          KV blocks its sessions and checkpoints pin
``execstate_tenant_checkpoint_bytes{tenant}``          host memory of those checkpoints (tokens,
                                                       keys, route rows, RNG states)
``execstate_tenant_hibernated_sessions{tenant}``      its hibernated LM sessions (also counted in
                                                       ``tenant_sessions``; they pin no KV block)
``execstate_tenant_hibernated_bytes{tenant}``          their manifests and units in the tiers
``execstate_tenant_quota{kind}``                       each tenant's limit per kind (absent: none)
``execstate_sessions_expired``                         LM sessions expired since start (idle TTL)
=====================================================  ============================================
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Gauge

from execstate.state.quotas import KINDS, Quotas

PREFIX = "execstate"
_SERIES = {
    "sessions": ("tenant_sessions", "Resident LM sessions of the tenant"),
    "agents": ("tenant_agents", "Live agents of the tenant"),
    "world_sessions": ("tenant_world_sessions", "Resident world sessions of the tenant"),
    "checkpoints": ("tenant_checkpoints", "Live checkpoints of the tenant's LM sessions"),
    "pinned_blocks": ("tenant_pinned_kv_blocks", "KV blocks pinned by the tenant's sessions and checkpoints"),
    "checkpoint_bytes": ("tenant_checkpoint_bytes", "Host memory of the tenant's checkpoints"),
    "hibernated": ("tenant_hibernated_sessions", "Hibernated LM sessions of the tenant (counted in its sessions)"),
    "hibernated_bytes": ("tenant_hibernated_bytes", "Bytes of the tenant's hibernated sessions in the tiers"),
}


class TenantMetrics:
    def __init__(self, registry: CollectorRegistry, quotas: Quotas | None = None) -> None:
        self.gauges = {kind: Gauge(f"{PREFIX}_{name}", text, ["tenant"], registry=registry)
                       for kind, (name, text) in _SERIES.items()}
        self.quota = Gauge(f"{PREFIX}_tenant_quota", "Each tenant's limit per kind of state", ["kind"],
                           registry=registry)
        self.expired = Gauge(f"{PREFIX}_sessions_expired", "LM sessions expired since start (idle TTL)",
                             registry=registry)
        for kind in KINDS:
            limit = (quotas or Quotas()).limit(kind)
            if limit is not None:
                self.quota.labels(kind).set(limit)

    def set(self, usage: Mapping[str, Mapping[str, int]], expired: int | None = None) -> None:
        """Replace every tenant series with ``usage`` (tenant -> kind -> count)."""
        for gauge in self.gauges.values():
            gauge.clear()
        for tenant, counts in usage.items():
            for kind, value in counts.items():
                series = self.gauges.get(kind)
                if series is not None:
                    series.labels(tenant).set(value)
        if expired is not None:
            self.expired.set(expired)

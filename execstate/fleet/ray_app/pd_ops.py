"""The fleet operations of a PD fleet (``fleet_ops.py``, with two engine deployments).

:class:`PDFleetOps` is :class:`~execstate.fleet.ray_app.fleet_ops.FleetOps` with:

- the rolling update's order alternating the roles (prefill, decode, prefill, ...): a pair of one
  version exists again as soon as possible (with one replica of each role, requests wait for the
  second switch: the ingress never pairs two versions, ``pd_ingress.py``);
- the versions the update reports, and the replicas the operations forget, recorded in the
  ingress's :class:`~execstate.fleet.router.pd_pairing.VersionDirectory`.

Each operation addresses a replica through the handle of its deployment (``PDFleetIngress.handle_of``);
a drain migrates a decode replica's sessions to the other decode replicas (a prefill replica holds none).
"""

from __future__ import annotations

from itertools import zip_longest
from typing import Protocol

from execstate.fleet.ray_app.fleet_ops import FleetOps, Ingress
from execstate.fleet.router.pd_pairing import DECODE, PREFILL, VersionDirectory


class PDIngress(Ingress, Protocol):
    directory: VersionDirectory


class PDFleetOps(FleetOps):
    def __init__(self, ingress: PDIngress) -> None:
        super().__init__(ingress)
        self.pd = ingress

    def rolling_order(self) -> list[str]:
        d = self.pd.directory
        registered = set(self.pd.replicas)
        pairs = zip_longest(d.replicas(PREFILL), d.replicas(DECODE))
        order = [rid for pair in pairs for rid in pair if rid is not None and rid in registered]
        return order + sorted(registered - set(order))

    async def prune(self) -> list[str]:
        gone = await super().prune()
        for rid in gone:
            self.pd.directory.forget(rid)
        return gone

    def switched(self, replica_id: str, version: str) -> None:
        super().switched(replica_id, version)
        self.pd.directory.record(replica_id, self.pd.directory.role_of(replica_id) or DECODE, version)

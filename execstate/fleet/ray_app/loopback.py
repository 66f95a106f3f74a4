"""A single-machine fleet's Serve replicas listen on loopback only (``fleet/cluster_plan.py``).

Ray's own servers follow Ray's local-only mode (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, set by the
CLI before Ray starts: node IP 127.0.0.1), but two listeners in a replica do not:

- Ray Serve 2.60 starts every replica's inter-deployment gRPC server on ``[::]:0`` (hard-coded in
  ``ray.serve._private.replica``): :func:`bind_replica_grpc_to_loopback`, called first in each
  deployment's constructor (which runs before Serve starts that server), makes it bind
  ``127.0.0.1`` in local-only mode; the handles reach a replica at its node IP, which is
  127.0.0.1 then. Where the Ray version no longer has the hook, nothing is patched (the CLI test
  of the fleet, tests/fleet/test_ray_cli_fleet.py, would then show the listener).
- NIXL's UCX transport (the KV connector that moves a migrating session's KV) listens on the
  machine's address: ``UCX_NET_DEVICES=lo`` (set with the local-only switch, inherited by the
  replicas) keeps it on loopback.
"""

from __future__ import annotations

import os
from typing import Any

from execstate.fleet.cluster_plan import LOCAL_ONLY_ENV


def bind_replica_grpc_to_loopback() -> bool:
    """In local-only mode, make this replica process's Serve gRPC server bind loopback; whether it did."""
    if os.environ.get(LOCAL_ONLY_ENV) != "0":
        return False
    from ray.serve._private import replica

    add = getattr(replica, "add_port_to_grpc_server", None)
    if add is None or getattr(add, "execstate_loopback", False):
        return add is not None

    def add_on_loopback(server: Any, address: str) -> int:
        if address.startswith("[::]:"):
            address = "127.0.0.1:" + address.rsplit(":", 1)[1]
        return add(server, address)

    add_on_loopback.execstate_loopback = True  # type: ignore[attr-defined]  # a marker on the function
    replica.add_port_to_grpc_server = add_on_loopback
    return True

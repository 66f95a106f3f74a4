"""What ``execstate serve MODEL --ray --replicas N`` promises before it starts anything (no Ray import).

- **The replica count is a promise.** Each engine replica reserves a share of the cluster's CPUs
  (Ray's ``num_cpus``): one CPU when there are enough, else the CPUs divided among the replicas
  (``2 / 3`` each for 3 replicas on 2 CPUs), never less than :data:`MIN_REPLICA_CPUS`. A count that
  would need less is refused with a message naming the largest count the machine takes
  (:func:`replica_cpus`), instead of a replica that Ray never schedules (a fleet that never
  finishes deploying, whose ready line never comes).
- **A single-machine cluster listens on loopback only.** Ray's processes (GCS, raylet, workers,
  agents) bind every interface by default; a cluster the CLI starts for itself binds 127.0.0.1,
  unless ``--ray-address`` (join a cluster) or a non-loopback ``--replica-host`` (replicas others
  reach) says the fleet spans hosts (:func:`local_only`). Ray reads the switch from its environment
  when it is imported (:data:`LOCAL_ONLY_ENV`, its own local-only mode: node IP 127.0.0.1, servers
  bound there), so :func:`keep_local` runs before ``ray`` is imported; the two listeners of a
  replica that do not follow it are handled in ``ray_app/loopback.py``.
"""

from __future__ import annotations

import math
import os

MIN_REPLICA_CPUS = 0.25
LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray's local-only mode, every server on loopback
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


class FleetPlanError(ValueError):
    """The fleet asked for cannot be placed; the message says why and what would fit."""


def replica_cpus(replicas: int, cpus: float) -> float:
    """The CPUs each of ``replicas`` engine replicas reserves on a cluster of ``cpus`` CPUs: 1, or an
    equal share (rounded down to 1/100) when fewer CPUs than replicas; ``FleetPlanError`` below
    :data:`MIN_REPLICA_CPUS`."""
    if replicas < 1:
        raise FleetPlanError(f"a fleet needs at least one engine replica, got {replicas}")
    if cpus <= 0:
        raise FleetPlanError("the Ray cluster offers no CPU to place engine replicas on")
    if replicas <= cpus:
        return 1.0
    share = math.floor(cpus / replicas * 100) / 100
    if share < MIN_REPLICA_CPUS:
        most = int(cpus / MIN_REPLICA_CPUS)
        raise FleetPlanError(f"{replicas} engine replicas on {cpus:g} CPUs would get {cpus / replicas:.2f} CPU each, "
                             f"less than the {MIN_REPLICA_CPUS} each needs: at most {most} replicas fit here")
    return share


def local_only(ray_address: str | None, replica_host: str) -> bool:
    """Whether the fleet is one machine's: no cluster to join and replicas reached on loopback."""
    return ray_address is None and replica_host in LOOPBACK


def keep_local(ray_address: str | None, replica_host: str) -> bool:
    """For a single-machine fleet, switch Ray to loopback-only (module docstring). Call before
    ``ray`` is imported; returns whether it did. An operator's own setting of the variable wins."""
    if not local_only(ray_address, replica_host):
        return False
    os.environ.setdefault(LOCAL_ONLY_ENV, "0")
    os.environ.setdefault("UCX_NET_DEVICES", "lo")  # NIXL's UCX transport: loopback too (ray_app/loopback.py)
    return os.environ[LOCAL_ONLY_ENV] == "0"

"""Whether an engine replica is still alive, as Ray knows it (the fleet's operations, the resume
of a lost replica's sessions)."""

from __future__ import annotations


def actor_alive(replica_id: str) -> bool:
    """False once Ray no longer finds the replica's actor by name (its full replica id, in the
    ``serve`` namespace): killed, crashed, or stopped. Blocking (a GCS lookup): call it off the
    event loop."""
    import ray

    try:
        ray.get_actor(replica_id, namespace="serve")
    except ValueError:
        return False
    return True

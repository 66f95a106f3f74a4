"""The ingress's session owner map (fleet/ray_app/prompt_route.py): where each session lives, with
what a resume needs (the engine id of its replica: its manifest key; its tenant), per caller."""

from __future__ import annotations

from execstate.fleet.ray_app.prompt_route import Held, SessionReplicas


def test_owner_records_engine_and_tenant_and_follows_moves():
    owners = SessionReplicas()
    owners.set("c1", "s", "r1", "Bearer k1", engine_id="e1", tenant="tenant-a")
    assert owners.held("c1", "s") == Held("r1", "Bearer k1", "e1", "tenant-a")
    assert owners.get("c2", "s") is None  # another caller (credential) never finds it
    owners.set("c1", "s", "r2", engine_id="e2")  # moved (drain, resume): authorization and tenant kept
    assert owners.held("c1", "s") == Held("r2", "Bearer k1", "e2", "tenant-a")
    owners.set("c1", "s", "r3")  # a move without the target's engine id: the old one is not kept
    assert owners.held("c1", "s").engine_id is None
    assert owners.held_by("r3") == [("c1", "s", "Bearer k1")] and owners.held_by("r1") == []
    owners.drop("c1", "s")
    assert owners.held("c1", "s") is None


def test_owner_map_is_bounded_least_recently_used_first():
    owners = SessionReplicas(capacity=2)
    owners.set("c", "a", "r1")
    owners.set("c", "b", "r1")
    assert owners.get("c", "a") == "r1"  # used: "b" is now the least recently used
    owners.set("c", "d", "r2")
    assert owners.get("c", "b") is None and owners.get("c", "a") == "r1" and owners.get("c", "d") == "r2"

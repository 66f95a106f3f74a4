"""After a rolling weight update, ``GET /v1/fleet/replicas`` lists every replica's new
``weights_version`` (it kept the version each replica registered with at start). Run on the
operations' own code with stand-ins for the ingress and the replicas' handles (no cluster: the
Ray test of the update, tests/fleet/test_ray_fleet_faults.py, checks the same through Serve)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

pytest.importorskip("ray")

from execstate.fleet.ray_app import fleet_ops  # noqa: E402
from execstate.fleet.ray_app.fleet_ops import FleetOps  # noqa: E402


class Call:
    def __init__(self, fn) -> None:
        self.fn = fn

    async def remote(self, *args):
        return self.fn(*args)


class Replica:
    def __init__(self, rid: str, log: list[str]) -> None:
        self.update_weights = Call(lambda route, source, version: log.append(rid) or version)


class Sessions:
    resumed: list = []


class FakeIngress:
    def __init__(self) -> None:
        self.log: list[str] = []
        self.replicas = {r: {"replica_id": r, "url": f"http://{r}", "weights_version": "v0"} for r in ("a", "b")}
        self.draining: set[str] = set()
        self.served: Counter[str] = Counter()
        self.retried = 0
        self.sessions = Sessions()
        self._handles = {r: Replica(r, self.log) for r in self.replicas}

    def handle_of(self, rid: str):
        return self._handles[rid]


class Req:
    """The part of a Starlette request the operations read."""

    def __init__(self, method, path, body=b"") -> None:
        self.method, self._body = method, body
        self.url = type("U", (), {"path": path})()

    async def body(self):
        return self._body


def test_the_replicas_list_shows_the_new_version(monkeypatch):
    monkeypatch.setattr(fleet_ops, "actor_alive", lambda rid: True)
    ing = FakeIngress()
    ops = FleetOps(ing)  # type: ignore[arg-type]

    async def run():
        body = json.dumps({"source": "/ckpt", "weights_version": "v1"}).encode()
        done = await ops.handle(Req("POST", "/v1/fleet/update_weights", body), operator=True)
        listed = await ops.handle(Req("GET", "/v1/fleet/replicas"), operator=False)
        return json.loads(done.body), json.loads(listed.body)

    done, listed = asyncio.run(run())
    assert done == {"versions": {"a": "v1", "b": "v1"}} and ing.log == ["a", "b"]
    assert [r["weights_version"] for r in listed["replicas"]] == ["v1", "v1"]
    assert not ing.draining


def test_only_an_operator_changes_the_fleet(monkeypatch):
    """A caller that is not an operator tenant gets 403 for drain and update_weights, and nothing
    is touched; it may still list the replicas."""
    monkeypatch.setattr(fleet_ops, "actor_alive", lambda rid: True)
    ing = FakeIngress()
    ops = FleetOps(ing)  # type: ignore[arg-type]

    async def run():
        update = json.dumps({"source": "/ckpt", "weights_version": "v1"}).encode()
        refused = [await ops.handle(Req("POST", "/v1/fleet/update_weights", update), operator=False),
                   await ops.handle(Req("POST", "/v1/fleet/drain", json.dumps({"replica": "a"}).encode()),
                                    operator=False)]
        listed = await ops.handle(Req("GET", "/v1/fleet/replicas"), operator=False)
        return refused, listed

    refused, listed = asyncio.run(run())
    assert [r.status_code for r in refused] == [403, 403]
    assert all(json.loads(r.body)["error"]["code"] == "unauthorized" for r in refused)
    assert ing.log == [] and not ing.draining
    assert listed.status_code == 200
    assert [r["weights_version"] for r in json.loads(listed.body)["replicas"]] == ["v0", "v0"]


def test_prompts_are_pinned_to_the_fleets_version_once_the_update_completed(monkeypatch):
    """While an update rolls both versions serve (no pin); once every replica switched, prompts go
    only to the new version's replicas."""
    monkeypatch.setattr(fleet_ops, "actor_alive", lambda rid: True)
    ing = FakeIngress()
    ops = FleetOps(ing)  # type: ignore[arg-type]
    pins: list = []
    for rid in ("a", "b"):
        ing._handles[rid].update_weights = Call(lambda route, source, version: pins.append(ops.pinned_version())
                                                or version)
    assert ops.pinned_version() is None
    asyncio.run(ops.update_weights("/ckpt", "v1"))
    assert pins == [None, None] and ops.pinned_version() == "v1"  # the stand-ins report it as given


def test_a_replica_registering_on_old_weights_after_an_update_is_switched(monkeypatch):
    """Ray replaces a lost replica from the deployment's arguments (v0): it registers, is taken out
    of service, switched to the fleet's v1, and put back; one registering on v1 is left alone."""
    monkeypatch.setattr(fleet_ops, "actor_alive", lambda rid: True)
    ing = FakeIngress()
    ops = FleetOps(ing)  # type: ignore[arg-type]
    seen_draining: list[bool] = []

    def switch(route, source, version):
        seen_draining.append("c" in ing.draining)  # out of service while it switches
        ing.log.append(f"{route.session_replica}:{source}:{version}")
        return version

    async def run():
        await ops.update_weights("/ckpt", "v1")
        ing._handles["c"] = Replica("c", ing.log)
        ing._handles["c"].update_weights = Call(switch)
        ing._handles["d"] = Replica("d", ing.log)
        for rid, version in (("c", "v0"), ("d", "v1")):
            ing.replicas[rid] = {"replica_id": rid, "weights_version": version}
            ops.on_register(ing.replicas[rid])
        assert set(ops.catching_up) == {"c"}
        await asyncio.gather(*ops.catching_up.values())

    asyncio.run(run())
    assert ing.log == ["a", "b", "c:/ckpt:v1"] and seen_draining == [True]
    assert {rid: r["weights_version"] for rid, r in ing.replicas.items()} == {"a": "v1", "b": "v1", "c": "v1",
                                                                              "d": "v1"}
    assert not ing.draining and not ops.catching_up


def test_the_catch_up_retries_until_the_call_reaches_its_replica(monkeypatch):
    """A replica registers before Ray routes to it: the call then reaches another replica, which
    refuses it by id (ValueError); the catch-up tries again. One that never switches stays out of
    service."""
    monkeypatch.setattr(fleet_ops, "actor_alive", lambda rid: True)
    ing = FakeIngress()
    ops = FleetOps(ing)  # type: ignore[arg-type]
    tries = {"c": 0, "e": 0}

    def refusing_until(rid: str, n: int):
        def call(route, source, version):
            tries[rid] += 1
            if tries[rid] <= n:
                raise ValueError(f"update_weights addressed to {rid} reached a")
            return version
        return Call(call)

    async def run():
        await ops.update_weights("/ckpt", "v1")
        ing._handles["c"] = Replica("c", ing.log)
        ing._handles["c"].update_weights = refusing_until("c", 2)
        ing._handles["e"] = Replica("e", ing.log)
        ing._handles["e"].update_weights = refusing_until("e", 99)
        for rid in ("c", "e"):
            ing.replicas[rid] = {"replica_id": rid, "weights_version": "v0"}
        await ops.catch_up("c", ops.target, attempts=5, retry_s=0)
        await ops.catch_up("e", ops.target, attempts=5, retry_s=0)

    asyncio.run(run())
    assert tries == {"c": 3, "e": 5}
    assert ing.replicas["c"]["weights_version"] == "v1" and ing.replicas["e"]["weights_version"] == "v0"
    assert ing.draining == {"e"}

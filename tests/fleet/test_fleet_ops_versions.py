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


def test_the_replicas_list_shows_the_new_version(monkeypatch):
    monkeypatch.setattr(fleet_ops, "actor_alive", lambda rid: True)
    ing = FakeIngress()
    ops = FleetOps(ing)  # type: ignore[arg-type]

    class Req:
        def __init__(self, method, path, body=b"") -> None:
            self.method, self._body = method, body
            self.url = type("U", (), {"path": path})()

        async def body(self):
            return self._body

    async def run():
        body = json.dumps({"source": "/ckpt", "weights_version": "v1"}).encode()
        done = await ops.handle(Req("POST", "/v1/fleet/update_weights", body))
        listed = await ops.handle(Req("GET", "/v1/fleet/replicas"))
        return json.loads(done.body), json.loads(listed.body)

    done, listed = asyncio.run(run())
    assert done == {"versions": {"a": "v1", "b": "v1"}} and ing.log == ["a", "b"]
    assert [r["weights_version"] for r in listed["replicas"]] == ["v1", "v1"]
    assert not ing.draining

"""Two tenants on the same servers cannot see or change each other's state ("Done when").

A hypothesis test drives random interleavings of two tenants' operations against two real servers
(uvicorn over engines with PD connectors, sharing a secret; each lists the other as a migration
target), over HTTP and the realtime WebSocket: create (HTTP or WS), attach (``session.resume``),
step (HTTP or WS), checkpoint and fork (WS), migrate (HTTP, to the other server), close (HTTP or
WS), disconnect (the WS goes: what it owns closes). Session ids come from a pool of three, so the
tenants keep naming the same ids. A model of what each tenant holds predicts every answer; after
every operation:

- the answer is the model's: a tenant naming an id only the other tenant has gets ``not_found``,
  a session its own live connection holds gets ``session_in_use`` over HTTP;
- every session of the *other* tenant, on both servers, is exactly as it was (step index,
  tokens, checkpoints, status, holder): read from the engines, not through any API;

and at the end, once every connection is gone and every session closed, both servers hold no
session, no checkpoint, no KV block, no pinned export, and ``/metrics`` shows no tenant series.

The default variant runs a CI-sized number of examples; ``test_..._long`` (``-m slow``) many more.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from security_helpers import KEY_A, KEY_B, WS, code_of, free_port, http, keys_of, server, wait_until, ws

from execstate.engine.pd_connector import PDConfig

SECRET = "isolation-shared-secret-0123456789"
KEYS = {"a": KEY_A, "b": KEY_B}
IDS = ("s1", "s2", "s3")
SAMPLING = {"temperature": 0, "max_tokens": 2, "ignore_eos": True}
INPUT = [11, 12, 13, 14, 15]


@dataclass
class Session:
    steps: int = 0
    checkpoints: int = 0


Key = tuple[int, str]  # (server, session id)


@dataclass
class Conn:
    server: int
    ws: WS
    stack: ExitStack
    attached: str | None = None
    owned: set[str] = field(default_factory=set)


class World:
    """The servers, each tenant's live connection and the model of what each tenant holds."""

    def __init__(self, servers: list[Any], ended: dict[str, set[Key]]) -> None:
        self.servers = servers
        self.urls = [s.url for s in servers]
        self.live: dict[str, dict[Key, Session]] = {"a": {}, "b": {}}
        self.ended = ended  # the servers remember ended sessions (calls say "closed"), across examples
        self.conns: dict[str, Conn | None] = {"a": None, "b": None}

    # -- reading the engines -----------------------------------------------------------------------
    def snapshot(self, tenant: str) -> set[tuple[Any, ...]]:
        out = set()
        for i, s in enumerate(self.servers):
            rows = s.app.state.ctx.sessions.call(lambda lm: [
                (rt.owner.tenant, rt.session_id, rt.step_index, tuple(rt.state.token_ids), rt.num_checkpoints,
                 rt.status.value, rt.holder) for rt in lm.manager.resident()])
            out |= {(i, *r[1:]) for r in rows if r[0] == tenant}
        return out

    def check_model(self) -> None:
        for tenant in ("a", "b"):
            seen = {(row[0], row[1]): row for row in self.snapshot(tenant)}
            assert set(seen) == set(self.live[tenant]), (tenant, sorted(seen), sorted(self.live[tenant]))
            for key, sess in self.live[tenant].items():
                row = seen[key]
                assert (row[2], row[4], row[5]) == (sess.steps, sess.checkpoints, "open"), (tenant, key, row, sess)
                assert (row[6] == "realtime") == self.held(tenant, key), (tenant, key, row)

    # -- the model ------------------------------------------------------------------------------------
    def held(self, tenant: str, key: Key) -> bool:
        conn = self.conns[tenant]
        return conn is not None and conn.server == key[0] and key[1] in conn.owned

    def end_session(self, tenant: str, key: Key) -> None:
        del self.live[tenant][key]
        self.ended[tenant].add(key)

    def new_session(self, tenant: str, key: Key, steps: int = 0) -> None:
        self.live[tenant][key] = Session(steps)
        self.ended[tenant].discard(key)

    def expect(
        self, tenant: str, key: Key, r: Any, ok: int = 200, ended: tuple[int, str | None] = (410, "closed")
    ) -> bool:
        """Check an HTTP answer on ``key``; True when it acted (the model then changes)."""
        if key in self.live[tenant]:
            if self.held(tenant, key):
                assert (r.status_code, code_of(r)) == (409, "session_in_use"), r.text
                return False
            assert r.status_code == ok, r.text
            return True
        if key in self.ended[tenant]:
            assert (r.status_code, code_of(r)) == ended, r.text
            return False
        assert (r.status_code, code_of(r)) == (404, "not_found"), r.text  # none, or only the other tenant's
        return False

    # -- connections --------------------------------------------------------------------------------
    def connect(self, tenant: str, server: int) -> Conn:
        conn = self.conns[tenant]
        if conn is not None and conn.server == server:
            return conn
        self.disconnect(tenant)
        stack = ExitStack()
        conn = Conn(server, stack.enter_context(ws(self.urls[server], KEYS[tenant])), stack)
        self.conns[tenant] = conn
        return conn

    def disconnect(self, tenant: str) -> None:
        conn = self.conns[tenant]
        if conn is None:
            return
        conn.stack.close()
        for sid in conn.owned:  # grace 0: what the connection owned is closed
            self.end_session(tenant, (conn.server, sid))
        self.conns[tenant] = None
        wait_until(lambda: not any(r[0] == conn.server and r[1] in conn.owned for r in self.snapshot(tenant)),
                   what="the dropped connection's sessions to close")

    # -- operations ---------------------------------------------------------------------------------
    def create(self, tenant: str, k: int, sid: str, via: str) -> None:
        key = (k, sid)
        if via == "http":
            r = http("POST", f"{self.urls[k]}/v1/sessions", KEYS[tenant], {"session_id": sid, "sampling": SAMPLING})
            if key in self.live[tenant]:
                assert (r.status_code, code_of(r)) == (400, "invalid"), r.text
            else:
                assert r.status_code == 200, r.text
                self.new_session(tenant, key)
            return
        conn = self.connect(tenant, k)
        ev = conn.ws.ask({"type": "session.create", "event_id": "c", "session": {
            "id": sid, "sampling": {"temperature": 0, "ignore_eos": True}, "max_tokens": 2}})
        if conn.attached is not None:
            assert (ev["type"], ev["error"]["code"]) == ("error", "session_exists"), ev
        elif key in self.live[tenant]:
            assert (ev["type"], ev["error"]["code"]) == ("error", "invalid"), ev
        else:
            assert ev["type"] == "session.created", ev
            conn.attached = sid
            conn.owned.add(sid)
            self.new_session(tenant, key)

    def attach(self, tenant: str, k: int, sid: str, _: Any) -> None:
        conn = self.connect(tenant, k)
        key = (k, sid)
        ev = conn.ws.ask({"type": "session.resume", "event_id": "r", "session_id": sid})
        if conn.attached is not None:
            assert (ev["type"], ev["error"]["code"]) == ("error", "session_exists"), ev
        elif key in self.live[tenant]:
            assert ev["type"] == "session.resumed", ev
            conn.attached = sid
            conn.owned.add(sid)
        else:
            want = "closed" if key in self.ended[tenant] else "not_found"  # the other tenant's is not found
            assert (ev["type"], ev["error"]["code"]) == ("error", want), ev

    def step(self, tenant: str, k: int, sid: str, via: str) -> None:
        key = (k, sid)
        if via == "ws":
            conn = self.conns[tenant]
            if conn is None or conn.server != k or conn.attached != sid:
                return
            done = conn.ws.respond(input={"token_ids": INPUT}, max_tokens=2)
            assert done["type"] == "response.done" and done["response"]["status"] == "completed", done
            self.live[tenant][key].steps += 1
            return
        r = http("POST", f"{self.urls[k]}/v1/sessions/{sid}/step", KEYS[tenant], {"input": INPUT, "max_tokens": 2})
        if self.expect(tenant, key, r):
            self.live[tenant][key].steps += 1

    def checkpoint(self, tenant: str, k: int, sid: str, _: Any) -> None:
        conn = self.conns[tenant]
        if conn is None or conn.server != k or conn.attached != sid:
            return
        ev = conn.ws.ask({"type": "session.checkpoint", "event_id": "k"})
        assert ev["type"] == "session.checkpointed", ev
        self.live[tenant][(k, sid)].checkpoints += 1

    def fork(self, tenant: str, k: int, sid: str, new: str) -> None:
        conn = self.conns[tenant]
        if conn is None or conn.server != k or conn.attached != sid:
            return
        ev = conn.ws.ask({"type": "session.fork", "event_id": "f", "session_id": new})
        if (k, new) in self.live[tenant]:
            assert (ev["type"], ev["error"]["code"]) == ("error", "invalid"), ev
            return
        assert ev["type"] == "session.forked", ev
        conn.owned.add(new)
        self.new_session(tenant, (k, new), self.live[tenant][(k, sid)].steps)

    def migrate(self, tenant: str, k: int, sid: str, _: Any) -> None:
        key, dst = (k, sid), (1 - k, sid)
        r = http("POST", f"{self.urls[k]}/v1/sessions/{sid}/migrate", KEYS[tenant],
                 {"target": self.urls[1 - k], "timeout_s": 30})
        if key in self.live[tenant] and not self.held(tenant, key) and dst in self.live[tenant]:
            assert (r.status_code, code_of(r)) == (502, "conflict"), r.text  # the id is open there: stays here
            return
        if self.expect(tenant, key, r):
            assert r.json()["committed"], r.text
            steps = self.live[tenant][key].steps
            self.end_session(tenant, key)
            self.new_session(tenant, dst, steps)

    def close(self, tenant: str, k: int, sid: str, via: str) -> None:
        key = (k, sid)
        if via == "ws":
            conn = self.conns[tenant]
            if conn is None or conn.server != k or conn.attached != sid:
                return
            assert conn.ws.ask({"type": "session.close", "event_id": "x"})["type"] == "session.closed"
            conn.attached = None
            conn.owned.discard(sid)
            self.end_session(tenant, key)
            return
        r = http("DELETE", f"{self.urls[k]}/v1/sessions/{sid}", KEYS[tenant])
        if self.expect(tenant, key, r, ended=(200, None)):  # closing a closed session: idempotent
            self.end_session(tenant, key)

    def apply(self, op: tuple[Any, ...]) -> None:
        tenant, kind, k, sid, arg = op
        other = "b" if tenant == "a" else "a"
        before = self.snapshot(other)
        if kind == "disconnect":
            self.disconnect(tenant)
        else:
            getattr(self, kind)(tenant, k, sid, arg)
        assert self.snapshot(other) == before, f"{op} changed the other tenant's sessions"
        self.check_model()

    def end(self) -> None:
        for tenant in ("a", "b"):
            self.disconnect(tenant)
            for (k, sid) in list(self.live[tenant]):
                assert http("DELETE", f"{self.urls[k]}/v1/sessions/{sid}", KEYS[tenant]).status_code == 200
                self.end_session(tenant, (k, sid))
        for s in self.servers:
            def empty(e: Any) -> tuple[int, ...]:
                return (len(e.scheduler.running) + len(e.scheduler.waiting), e.block_pool.num_used,
                        e.kv_holds.num_holders, e.pd.num_pinned_exports)

            def resident(s: Any = s) -> int:
                return s.app.state.ctx.sessions.call(lambda lm: lm.manager.num_resident)

            wait_until(lambda s=s, resident=resident: (resident(), *s.engine.call(empty)) == (0, 0, 0, 0, 0),
                       what="everything released")
            s.engine.call(lambda e: e.check_integrity())
            answer = http("GET", f"{s.url}/metrics", next(iter(KEYS.values())))  # behind a key
            assert answer.status_code == 200, answer.text
            metrics = answer.text
            assert "execstate_tenant_sessions{" not in metrics and "execstate_tenant_checkpoints{" not in metrics


VIA = st.sampled_from(["http", "ws"])


def op_for(world: World) -> st.SearchStrategy[tuple[Any, ...]]:
    """The next operation of either tenant, drawn against the current state."""
    return st.sampled_from("ab").flatmap(lambda tenant: ops_of(world, tenant))


def ops_of(world: World, tenant: str) -> st.SearchStrategy[tuple[Any, ...]]:
    """``tenant``'s next operation: on its own sessions, on the other tenant's (the probes across
    tenants: the same ids) or on random ones; with a session attached to its connection, often
    on that one (checkpoints, forks and WebSocket steps need it)."""
    other = "b" if tenant == "a" else "a"
    random_key = st.tuples(st.sampled_from([0, 1]), st.sampled_from(IDS))
    own = st.sampled_from(sorted(world.live[tenant])) if world.live[tenant] else random_key
    theirs = st.sampled_from(sorted(world.live[other])) if world.live[other] else random_key
    key = st.sampled_from([own] * 7 + [theirs] * 2 + [random_key]).flatmap(lambda k: k)

    def op(kind: str, on: st.SearchStrategy[Key], arg: st.SearchStrategy[Any]) -> st.SearchStrategy[tuple[Any, ...]]:
        return st.tuples(on, arg).map(lambda t: (tenant, kind, t[0][0], t[0][1], t[1]))

    options = [op("create", random_key, VIA), op("step", key, st.just("http")), op("step", key, st.just("http")),
               op("migrate", key, st.none()), op("close", key, VIA), op("attach", key, st.none()),
               op("disconnect", key, st.none())]
    conn = world.conns[tenant]
    if conn is not None and conn.attached is not None:
        mine = st.just((conn.server, conn.attached))
        options += [op("checkpoint", mine, st.none()), op("checkpoint", mine, st.none()),
                    op("fork", mine, st.sampled_from(IDS)), op("step", mine, st.just("ws")),
                    op("step", mine, st.just("ws")), op("close", mine, st.just("ws"))]
    return st.sampled_from(options).flatmap(lambda o: o)


@pytest.fixture(scope="module")
def servers(model_dir, tmp_path_factory):
    keys = keys_of(tmp_path_factory.mktemp("keys") / "keys", a=KEY_A, b=KEY_B)
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    with ExitStack() as stack:
        built = [stack.enter_context(server(
            model_dir, engine_kw={"max_sessions": 16}, port=ports[i], keys=keys, migration_targets=[urls[1 - i]],
            pd=PDConfig(role="kv_both", secret=SECRET, engine_id=f"iso-{i}", timeout_s=5.0))) for i in range(2)]
        yield built, {"a": set(), "b": set()}


def run(servers: tuple[list[Any], dict[str, set[Key]]], data: st.DataObject, max_ops: int) -> None:
    world = World(*servers)
    try:
        for _ in range(max_ops):
            world.apply(data.draw(op_for(world), label="operation"))
    finally:
        world.end()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(st.data())
def test_two_tenants_never_observe_or_change_each_others_state(servers, data):
    run(servers, data, 16)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(st.data())
def test_two_tenants_never_observe_or_change_each_others_state_long(servers, data):
    run(servers, data, 40)

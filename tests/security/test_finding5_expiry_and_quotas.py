"""Before this: nothing expired, and there were no quotas.

Reproduces:

- sessions opened with ``POST /v1/sessions`` held the session cap with no client connected: every
  later ``session.create`` was refused with ``capacity`` until someone deleted them. Now a detached
  session unused for ``--session-idle-ttl`` expires (here 1 s): it releases everything, later
  calls on it get ``expired``, and a new session fits;
- one session took any number of checkpoints, and every reply listed every checkpoint id (54 KB
  after 5,000). Now a session holds at most ``--max-session-checkpoints`` (64) and the next one is
  refused with ``checkpoint_limit``; replies name what changed, not every id;
- per-tenant quotas: a tenant past its ``--tenant-max-sessions`` gets ``quota`` while another
  tenant still opens sessions; ``/metrics`` shows what each tenant holds, by tenant name (behind
  a key since ``/metrics`` needs one on a keyed server; ``--public-metrics`` opens it).

(Checkpoint memory coming back after 5,000 checkpoints and a close: test_checkpoint_memory.py.)
"""

from __future__ import annotations

import time

from security_helpers import KEY_A, KEY_B, code_of, http, keys_of, server, ws


def policy(**kw):
    try:
        from execstate.serve.app import serve_policy
        from execstate.state.quotas import Quotas
    except ImportError:  # the code before the fix: no policy to give
        return None
    quotas = kw.pop("quotas", None)
    return serve_policy(quotas=Quotas(**quotas) if quotas else None, **kw)


def test_detached_sessions_expire_and_free_their_place(model_dir):
    with server(model_dir, engine_kw={"max_sessions": 4}, policy=policy(idle_ttl_s=1.0)) as s:
        for i in range(4):
            r = http("POST", f"{s.url}/v1/sessions", body={"session_id": f"idle-{i}"})
            assert r.status_code == 200, r.text
        assert http("POST", f"{s.url}/v1/sessions/idle-0/step", body={"input": [5, 6, 7], "max_tokens": 2}
                    ).status_code == 200
        with ws(s.url) as c:
            refused = c.ask({"type": "session.create", "event_id": "c", "session": {"id": "rt-1"}})
            assert refused["type"] == "error" and refused["error"]["code"] == "capacity"
            time.sleep(1.6)  # nobody uses the four sessions: past the idle TTL
            created = c.ask({"type": "session.create", "event_id": "c", "session": {"id": "rt-1"}})
            assert created["type"] == "session.created", created
        for i in range(4):
            r = http("POST", f"{s.url}/v1/sessions/idle-{i}/step", body={"input": [5]})
            assert (r.status_code, code_of(r)) == (410, "expired"), r.text
        held = s.engine.call(lambda e: (e.kv_holds.num_holders, e.block_pool.num_used))
        assert held == (0, 0)  # the expired sessions released their KV (rt-1 closed with its socket)


def test_checkpoints_per_session_are_capped_and_replies_stay_small(model_dir):
    with server(model_dir) as s, ws(s.url) as c:
        c.ask({"type": "session.create", "event_id": "c", "session": {"id": "cp", "max_tokens": 2}})
        c.respond(input={"token_ids": [5, 6, 7, 8]})
        sizes = []
        for i in range(64):
            c.send({"type": "session.checkpoint", "event_id": i})
            raw = c.ws.recv(60)
            sizes.append(len(raw))
            assert '"session.checkpointed"' in raw, raw
        assert max(sizes) < 1024 and max(sizes) - min(sizes) < 8, sizes  # no list of every id
        refused = c.ask({"type": "session.checkpoint", "event_id": 64})
        assert (refused["type"], refused["error"]["code"]) == ("error", "checkpoint_limit"), refused
        assert c.ask({"type": "checkpoint.release", "event_id": 65, "checkpoint_id": "cp-1"})["type"] \
            == "checkpoint.released"
        again = c.ask({"type": "session.checkpoint", "event_id": 66})
        assert again["type"] == "session.checkpointed" and again["session"]["num_checkpoints"] == 64
        info = c.ask({"type": "session.get", "event_id": 67})  # asked for: the list is there
        assert len(info["session"]["checkpoints"]) == 64 and "cp-1" not in info["session"]["checkpoints"]


def test_a_tenant_past_its_quota_does_not_stop_another(model_dir, tmp_path):
    keys = keys_of(tmp_path / "keys", a=KEY_A, b=KEY_B)
    with server(model_dir, keys=keys, api_key=KEY_A, policy=policy(quotas={"sessions": 2, "agents": 1})) as s:
        for i in range(2):
            assert http("POST", f"{s.url}/v1/sessions", KEY_A, {"session_id": f"a-{i}"}).status_code == 200
        r = http("POST", f"{s.url}/v1/sessions", KEY_A, {"session_id": "a-2"})
        assert (r.status_code, code_of(r)) == (429, "quota"), r.text
        for i in range(2):
            assert http("POST", f"{s.url}/v1/sessions", KEY_B, {"session_id": f"a-{i}"}).status_code == 200
        metrics = http("GET", f"{s.url}/metrics", KEY_A).text  # tenant names only (a key: see --public-metrics)
        assert 'execstate_tenant_sessions{tenant="a"} 2.0' in metrics
        assert 'execstate_tenant_sessions{tenant="b"} 2.0' in metrics
        assert 'execstate_tenant_quota{kind="sessions"} 2.0' in metrics
        assert KEY_A not in metrics and KEY_B not in metrics
        open_agent = {"type": "session.create", "event_id": "a", "session": {"max_response_tokens": 2}}
        with ws(s.url, KEY_A, "/v1/realtime/agent") as a1, ws(s.url, KEY_A, "/v1/realtime/agent") as a2, \
                ws(s.url, KEY_B, "/v1/realtime/agent") as b1:
            assert a1.ask(open_agent)["type"] == "session.created"
            refused = a2.ask(open_agent)
            assert (refused["type"], refused["error"]["code"]) == ("error", "quota"), refused
            assert b1.ask(open_agent)["type"] == "session.created"  # the other tenant's agents quota

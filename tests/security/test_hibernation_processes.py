"""A session hibernated on one server wakes on another from the shared tier (docs/security.md; docs/offload.md).

Two ``execstate serve`` processes A and B share a ``redis-server`` (their Redis tier) and the
instances' secret. A session stepped on A is hibernated there with a reference for B's engine;
B imports it by reference and serves it: its next steps equal those of a twin session on A that
never slept (tokens and routes). From then on A no longer serves it (``closed``); the reference
cannot be replayed, nor used by a server it was not made for, nor forged without the secret.
"""

from __future__ import annotations

import base64
import shutil
from contextlib import ExitStack

import pytest
from security_helpers import KEY_A, code_of, free_port, http, start_process, stop_process, wait_healthy

from execstate_bench.redis_server import RedisServer

SECRET = "hibernation-processes-secret-0123456789"
SAMPLING = {"temperature": 0.8, "seed": 3, "max_tokens": 5, "ignore_eos": True}
PROMPT = list(range(40, 120))


@pytest.fixture(scope="module")
def pair(model_dir, tmp_path_factory):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    redis = RedisServer(tmp_path_factory.mktemp("redis_hib"), "--enable-debug-command", "local").start()
    ports = {name: free_port() for name in "AB"}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    base = ["serve", str(model_dir), "--served-model-name", "m", "--enable-return-routed-experts", "--api-key", KEY_A,
            "--offload-dram", str(16 << 20), "--offload-redis-url", redis.url]
    with ExitStack():
        procs = {name: start_process(base, ports[name], SECRET) for name in "AB"}
        try:
            for name, proc in procs.items():
                wait_healthy(proc, urls[name])
            yield urls
        finally:
            for proc in procs.values():
                stop_process(proc)
            redis.kill()


def _step(url: str, sid: str, ids: list[int]) -> dict:
    r = http("POST", f"{url}/v1/sessions/{sid}/step", KEY_A, {"input": ids, "return_routes": True})
    assert r.status_code == 200, r.text
    return r.json()


def test_wake_on_another_server_from_the_shared_tier(pair):
    a, b = pair["A"], pair["B"]
    b_id = http("GET", f"{b}/v1/hibernation", KEY_A).json()
    assert b_id["shared_tier"] is True
    for sid in ("moving", "twin"):
        assert http("POST", f"{a}/v1/sessions", KEY_A, {"session_id": sid, "sampling": SAMPLING}).status_code == 200
        _step(a, sid, PROMPT)
        _step(a, sid, [7, 8, 9])
    r = http("POST", f"{a}/v1/sessions/moving/hibernate", KEY_A, {"target_engine_id": b_id["engine_id"]})
    assert r.status_code == 200, r.text
    slept = r.json()
    assert slept["status"] == "hibernated" and slept["num_kv_tokens"] == 0 and slept["manifest_key"]
    ref = slept["reference"]
    wrong = http("POST", f"{a}/v1/sessions/import", None, {"reference": ref})  # A is not the target
    assert wrong.status_code == 403 and code_of(wrong) == "wrong_target"
    forged = base64.b64decode(ref)
    forged = base64.b64encode(forged[:-3] + bytes(3 * [ord("0")])).decode()
    assert code_of(http("POST", f"{b}/v1/sessions/import", None, {"reference": forged})) in ("unauthorized", "invalid")
    r = http("POST", f"{b}/v1/sessions/import", None, {"reference": ref})
    assert r.status_code == 200, r.text
    woke = r.json()
    assert woke["status"] == "open" and woke["session_id"] == "moving" and woke["step_index"] == 2
    again = http("POST", f"{b}/v1/sessions/import", None, {"reference": ref})
    assert again.status_code == 409 and code_of(again) == "replay"
    for ids in ([11, 12], [13]):
        got, want = _step(b, "moving", ids), _step(a, "twin", ids)
        assert got["token_ids"] == want["token_ids"] and got["step_index"] == want["step_index"]
        assert got["routed_experts"] == want["routed_experts"]
    tokens_b = http("GET", f"{b}/v1/sessions/moving", KEY_A).json()["token_ids"]
    assert tokens_b == http("GET", f"{a}/v1/sessions/twin", KEY_A).json()["token_ids"]
    # A no longer serves it: its wake finds the manifest claimed by B
    r = http("POST", f"{a}/v1/sessions/moving/step", KEY_A, {"input": [1]})
    assert r.status_code == 410 and code_of(r) == "closed"
    assert http("GET", f"{a}/v1/sessions/moving", KEY_A).json()["status"] == "closed"
    m = http("GET", f"{a}/metrics", KEY_A).text  # behind the key (--public-metrics opens it)
    assert "execstate_tenant_sessions" in m


def test_local_wake_claims_the_manifest_first(pair):
    """A session hibernated on A and woken on A: a reference made for B before then finds nothing."""
    a, b = pair["A"], pair["B"]
    b_id = http("GET", f"{b}/v1/hibernation", KEY_A).json()["engine_id"]
    assert http("POST", f"{a}/v1/sessions", KEY_A, {"session_id": "stay", "sampling": SAMPLING}).status_code == 200
    first = _step(a, "stay", PROMPT)
    ref = http("POST", f"{a}/v1/sessions/stay/hibernate", KEY_A, {"target_engine_id": b_id}).json()["reference"]
    metrics = http("GET", f"{a}/metrics", KEY_A).text
    assert 'execstate_tenant_hibernated_sessions{tenant="default"} 1.0' in metrics
    assert http("POST", f"{a}/v1/sessions/stay/wake", KEY_A).json()["status"] == "open"
    r = http("POST", f"{b}/v1/sessions/import", None, {"reference": ref})
    assert r.status_code == 404 and code_of(r) == "not_found"
    assert _step(a, "stay", [5])["step_index"] == first["step_index"] + 1

"""PD over real processes: ``execstate serve`` as prefill and decode, ``execstate proxy``.

Each instance is its own OS process; KV moves P -> D through NIXL (UCX), the manifest
through ZeroMQ, and only handoff parameters through the proxy. The oracle is a
single-instance offline run on the same weights.
"""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from serve_helpers import free_port

from execstate import LLM, SamplingParams
from execstate.identity.secret_ring import SecretRing

ROOT = Path(__file__).resolve().parents[2]
SECRET = "http-test-secret-0123456789abcdef"  # shared by P, D and the proxy (EXECSTATE_KV_SECRET)


def _kv_cfg(role: str, **extra) -> str:
    cfg = {
        "kv_connector": "NixlConnector",
        "kv_role": role,
        "enable_routed_experts_transfer": True,
        "kv_load_failure_policy": "fail",
        "kv_connector_extra_config": {"transfer_timeout_s": 3.0, **extra},
    }
    return json.dumps(cfg)


def start(args: list[str], port: int, fault: dict | None = None, secret: str | None = SECRET) -> subprocess.Popen:
    """``execstate ARGS --port PORT``; with ``fault``, through the fault-injecting launcher."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env.pop("EXECSTATE_KV_SECRET", None)
    if secret is not None:
        env["EXECSTATE_KV_SECRET"] = secret
    launcher = ["execstate"] if fault is None else ["execstate_bench.faulty_serve", json.dumps(fault)]
    proc = subprocess.Popen(
        [sys.executable, "-m", *launcher, *args, "--port", str(port)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{args[0]} exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"{args[0]} did not become healthy")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def cluster(model_dir):
    pp, dp, xp = free_port(), free_port(), free_port()
    served = ["serve", str(model_dir), "--enable-return-routed-experts", "--served-model-name", "m"]
    p = start([*served, "--kv-transfer-config", _kv_cfg("kv_producer")], pp)
    d = start([*served, "--kv-transfer-config", _kv_cfg("kv_consumer")], dp)
    x = start(["proxy", "--prefill", f"http://127.0.0.1:{pp}", "--decode", f"http://127.0.0.1:{dp}"], xp)
    yield {"p": f"http://127.0.0.1:{pp}", "d": f"http://127.0.0.1:{dp}", "x": f"http://127.0.0.1:{xp}",
           "procs": (p, d, x)}
    for proc in (x, d, p):
        stop(proc)


def prompt(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 500, n).tolist()


def routes(b64: str) -> np.ndarray:
    return np.load(io.BytesIO(base64.b64decode(b64)))


def test_pd_through_proxy_equals_single_instance(cluster, model_dir):
    ids = prompt(21, 70)
    body = {"model": "m", "prompt": ids, "max_tokens": 8, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    r = httpx.post(cluster["x"] + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    got = r.json()
    single = LLM(str(model_dir), enable_return_routed_experts=True).generate(
        {"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False
    )[0].outputs[0]
    choice = got["choices"][0]
    assert choice["token_ids"] == single.token_ids
    np.testing.assert_array_equal(routes(choice["routed_experts"]), single.routed_experts)
    assert got["usage"]["prompt_token_sources"] == {"local_cache": 0, "offloaded": 0, "transferred": 64, "computed": 6}
    # streaming through the proxy gives the same tokens
    with httpx.stream("POST", cluster["x"] + "/v1/completions", json=dict(body, stream=True), timeout=60) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    streamed = [t for e in events for c in e["choices"] for t in c.get("token_ids") or []]
    assert streamed == single.token_ids


def test_prefill_reply_carries_handoff_not_routes(cluster):
    body = {"model": "m", "prompt": prompt(22, 40), "max_tokens": 1, "temperature": 0,
            "kv_transfer_params": {"do_remote_decode": True}}
    r = httpx.post(cluster["p"] + "/v1/completions", json=body, timeout=60).json()
    assert r["choices"][0].get("routed_experts") is None
    kv = r["kv_transfer_params"]
    assert kv["do_remote_prefill"] and kv["num_blocks"] == 2 and kv["transfer_id"]
    # D pulls it (and releases it on P)
    d = httpx.post(cluster["d"] + "/v1/completions", json=dict(body, kv_transfer_params=kv, max_tokens=4),
                   timeout=60).json()
    assert d["usage"]["prompt_token_sources"]["transferred"] == 32


class Trap:
    """A TCP listener standing in for an address a client invented: records any connection."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.addr = f"tcp://127.0.0.1:{self.sock.getsockname()[1]}"

    def connected(self, wait_s: float) -> bool:
        self.sock.settimeout(wait_s)
        try:
            conn, _ = self.sock.accept()
        except TimeoutError:
            return False
        conn.close()
        return True

    def close(self) -> None:
        self.sock.close()


def _transfers(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("execstate_kv_transfers_total"))


def test_untrusted_handoffs_are_400_and_decode_dials_nothing(cluster):
    from execstate.transfer.handoff import Handoff

    trap = Trap()
    try:
        body = {"model": "m", "prompt": prompt(24, 40), "max_tokens": 2, "temperature": 0}
        good = httpx.post(cluster["p"] + "/v1/completions", timeout=60,
                          json=dict(body, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
                          ).json()["kv_transfer_params"]
        h = Handoff("prefill-evil", trap.addr, "prefill-evil/1", 0, 2, 16, int(time.time()) + 60)
        cases = {
            "tampered": dict(good, remote_addr=trap.addr),
            "wrong secret": h.to_params(SecretRing(b"not-the-shared-secret-0123456789")),
            "expired": Handoff(**{**h.__dict__, "expires_at": int(time.time()) - 1}).to_params(
                SecretRing(SECRET.encode())),
            "missing signature, engine not allow-listed": h.to_params(None),
            "malformed": dict(h.to_params(SecretRing(SECRET.encode())), num_blocks="2"),
        }
        before = _transfers(cluster["d"])
        for name, kv in cases.items():
            for stream in (False, True):
                r = httpx.post(cluster["d"] + "/v1/completions", json=dict(body, kv_transfer_params=kv, stream=stream),
                               timeout=60)
                assert r.status_code == 400, (name, r.text)
                err = r.json()["error"]
                assert err["param"] == "kv_transfer_params" and err["type"] == "invalid_request_error", name
        assert not trap.connected(0.5) and _transfers(cluster["d"]) == before
        # The proxy never forwards a client's kv_transfer_params (even validly signed ones).
        signed_to_trap = h.to_params(SecretRing(SECRET.encode()))
        r = httpx.post(cluster["x"] + "/v1/completions", json=dict(body, kv_transfer_params=signed_to_trap), timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["prompt_token_sources"]["transferred"] == 32
        assert not trap.connected(0.5)
        # Control: a handoff D does trust makes it dial (so the trap would have seen the cases above).
        fresh = dict(body, prompt=prompt(25, 40), kv_transfer_params=signed_to_trap)  # not in D's cache
        r = httpx.post(cluster["d"] + "/v1/completions", json=fresh, timeout=60)
        assert trap.connected(10)
        assert r.status_code >= 400 and "KV load" in r.text  # the trap speaks no ZeroMQ: timeout
    finally:
        trap.close()


def test_killed_prefill_gives_request_error_and_decode_recovers(cluster):
    """Last in this module: it kills the shared prefill process."""
    body = {"model": "m", "prompt": prompt(23, 40), "max_tokens": 4, "temperature": 0}
    kv = httpx.post(cluster["p"] + "/v1/completions",
                    json=dict(body, max_tokens=1, kv_transfer_params={"do_remote_decode": True}),
                    timeout=60).json()["kv_transfer_params"]
    p = cluster["procs"][0]
    p.kill()  # the prefill process dies with the transfer pending
    p.wait(10)
    t0 = time.monotonic()
    r = httpx.post(cluster["d"] + "/v1/completions", json=dict(body, kv_transfer_params=kv), timeout=60)
    assert r.status_code >= 400 and "KV load" in r.text
    ok = httpx.post(cluster["d"] + "/v1/completions", json=body, timeout=60)
    recovery = time.monotonic() - t0
    assert ok.status_code == 200 and len(ok.json()["choices"][0]["text"]) >= 0
    assert httpx.get(cluster["d"] + "/health").status_code == 200
    assert recovery < 30

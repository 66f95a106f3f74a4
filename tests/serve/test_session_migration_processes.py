"""Session migration between real ``execstate serve`` processes (KV over NIXL between processes,
the manifest over ZeroMQ, the session offer over HTTP): a migrated session steps on the target as
it would have in place; a target whose KV loads are corrupted (the fault-injecting launcher) fails
the migration and the session keeps being served at the source, the target keeping nothing."""

from __future__ import annotations

import base64
import io
import json

import httpx
import numpy as np
import pytest
from serve_helpers import free_port
from test_pd_http import start, stop

from execstate import LLM, SamplingParams

KEY = "proc-migration-api-key"
AUTH = {"authorization": f"Bearer {KEY}"}
SAMPLING = {"temperature": 0.8, "seed": 9, "max_tokens": 6, "ignore_eos": True}
KV_BOTH = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_load_failure_policy": "fail",
                      "enable_routed_experts_transfer": True,
                      "kv_connector_extra_config": {"transfer_timeout_s": 3.0}})


def ids(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 500, n).tolist()


A, B, C = ids(70, 45), ids(71, 5), ids(72, 7)


@pytest.fixture(scope="module")
def servers(model_dir):
    args = ["serve", str(model_dir), "--enable-return-routed-experts", "--served-model-name", "m",
            "--api-key", KEY, "--kv-transfer-config", KV_BOTH]
    ports = [free_port() for _ in range(3)]
    procs = [start(args, ports[0]), start(args, ports[1]), start(args, ports[2], fault={"mode": "corrupt"})]
    yield [f"http://127.0.0.1:{p}" for p in ports]
    for proc in procs:
        stop(proc)


def call(method: str, url: str, body: dict | None = None) -> dict:
    r = httpx.request(method, url, json=body, headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def rows(b64: str) -> np.ndarray:
    return np.load(io.BytesIO(base64.b64decode(b64)))


@pytest.mark.slow
def test_migration_between_server_processes(servers, model_dir):
    src, dst, faulty = servers
    ref = LLM(str(model_dir), enable_return_routed_experts=True, seed=0).open_session(
        sampling_params=SamplingParams(**SAMPLING))
    want = [ref.step(x) for x in (A, B, C)]
    for sid in ("p-ok", "p-fault"):
        call("POST", f"{src}/v1/sessions", {"session_id": sid, "sampling": SAMPLING})
        for x, w in zip((A, B), want, strict=False):
            assert call("POST", f"{src}/v1/sessions/{sid}/step", {"input": x})["token_ids"] == w.token_ids
    m = call("POST", f"{src}/v1/sessions/p-ok/migrate", {"target": dst})
    assert (m["blocks_transferred"], m["tokens_recomputed"]) == (3, 61 - 48)
    c = call("POST", f"{dst}/v1/sessions/p-ok/step", {"input": C, "return_routes": True})
    assert c["token_ids"] == want[2].token_ids
    assert rows(c["routed_experts"]).tobytes() == want[2].routed_experts.tobytes()
    info = call("GET", f"{dst}/v1/sessions/p-ok?routes=true")
    assert info["token_ids"] == ref.token_ids and rows(info["routed_experts"]).tobytes() == ref.routed_experts.tobytes()

    r = httpx.post(f"{src}/v1/sessions/p-fault/migrate", json={"target": faulty}, headers=AUTH, timeout=120)
    assert r.status_code == 502 and r.json()["error"]["code"] == "checksum_mismatch", r.text
    assert httpx.get(f"{faulty}/v1/sessions/p-fault", headers=AUTH).status_code == 404  # nothing kept
    c = call("POST", f"{src}/v1/sessions/p-fault/step", {"input": C, "return_routes": True})
    assert c["token_ids"] == want[2].token_ids  # served at the source as if nothing had happened
    assert rows(c["routed_experts"]).tobytes() == want[2].routed_experts.tobytes()

"""PD across two hosts: P and D in two network namespaces joined by a veth pair.

P, D and the proxy each see only their own namespace; KV (NIXL/UCX over TCP), the
manifest (ZeroMQ) and HTTP all cross the veth link between 10.231.7.1 (P) and
10.231.7.2 (D), addresses that exist only inside namespaces this test creates.
Skipped where network namespaces cannot be made (needs root / CAP_SYS_ADMIN).
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from execstate import LLM, SamplingParams

ROOT = Path(__file__).resolve().parents[2]
P_ADDR, D_ADDR = "10.231.7.1", "10.231.7.2"


def sh(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True)


@pytest.fixture(scope="module")
def hosts():
    if shutil.which("ip") is None:
        pytest.skip("iproute2 ('ip') is not installed")
    tag = uuid.uuid4().hex[:6]
    ns_p, ns_d = f"es-p-{tag}", f"es-d-{tag}"
    if sh("ip", "netns", "add", ns_p).returncode != 0:
        pytest.skip("cannot create network namespaces here (needs root / CAP_SYS_ADMIN)")
    try:
        cmds = [
            ("ip", "netns", "add", ns_d),
            ("ip", "link", "add", f"vp{tag}", "type", "veth", "peer", "name", f"vd{tag}"),
            ("ip", "link", "set", f"vp{tag}", "netns", ns_p),
            ("ip", "link", "set", f"vd{tag}", "netns", ns_d),
            ("ip", "-n", ns_p, "addr", "add", f"{P_ADDR}/24", "dev", f"vp{tag}"),
            ("ip", "-n", ns_d, "addr", "add", f"{D_ADDR}/24", "dev", f"vd{tag}"),
            ("ip", "-n", ns_p, "link", "set", f"vp{tag}", "up"),
            ("ip", "-n", ns_d, "link", "set", f"vd{tag}", "up"),
            ("ip", "-n", ns_p, "link", "set", "lo", "up"),
            ("ip", "-n", ns_d, "link", "set", "lo", "up"),
        ]
        for c in cmds:
            r = sh(*c)
            if r.returncode != 0:
                pytest.skip(f"cannot set up the veth link ({' '.join(c)}): {r.stderr.strip()}")
        yield ns_p, ns_d
    finally:
        sh("ip", "netns", "del", ns_p)
        sh("ip", "netns", "del", ns_d)


def in_ns(ns: str, *args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
               EXECSTATE_KV_SECRET="netns-test-secret-0123456789abcdef")
    env.pop("UCX_NET_DEVICES", None)  # the KV crosses the namespaces' veth pair: never loopback-only
    return subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, *args], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


CLIENT = textwrap.dedent(
    """
    import json, sys, time, httpx
    url, body = sys.argv[1], json.loads(sys.argv[2])
    health = [u + "/health" for u in sys.argv[3:]]
    deadline = time.monotonic() + 120
    while health and time.monotonic() < deadline:
        try:
            health = [h for h in health if httpx.get(h, timeout=1).status_code != 200]
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    r = httpx.post(url, json=body, timeout=120)
    print(json.dumps({"status": r.status_code, "body": r.json()}))
    """
)


def test_pd_across_two_network_namespaces(hosts, model_dir):
    ns_p, ns_d = hosts
    kv = {"kv_connector": "NixlConnector", "enable_routed_experts_transfer": True,
          "kv_connector_extra_config": {"transfer_timeout_s": 10.0}}
    served = ["-m", "execstate", "serve", str(model_dir), "--enable-return-routed-experts",
              "--served-model-name", "m", "--port", "8100"]
    p_kv = dict(kv, kv_role="kv_producer")
    p_kv["kv_connector_extra_config"] = dict(kv["kv_connector_extra_config"], side_channel_host=P_ADDR)
    procs = [
        in_ns(ns_p, *served, "--host", P_ADDR, "--kv-transfer-config", json.dumps(p_kv)),
        in_ns(ns_d, *served, "--host", D_ADDR, "--kv-transfer-config", json.dumps(dict(kv, kv_role="kv_consumer"))),
        in_ns(ns_d, "-m", "execstate", "proxy", "--prefill", f"http://{P_ADDR}:8100",
              "--decode", f"http://{D_ADDR}:8100", "--host", D_ADDR, "--port", "8200"),
    ]
    try:
        ids = np.random.default_rng(31).integers(3, 500, 50).tolist()
        body = {"model": "m", "prompt": ids, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
                "return_token_ids": True}
        client = in_ns(ns_d, "-c", CLIENT, f"http://{D_ADDR}:8200/v1/completions", json.dumps(body),
                       f"http://{P_ADDR}:8100", f"http://{D_ADDR}:8100")
        out, err = client.communicate(timeout=240)
        assert client.returncode == 0, err[-2000:]
        res = json.loads(out.strip().splitlines()[-1])
        assert res["status"] == 200, res
        choice = res["body"]["choices"][0]
        single = LLM(str(model_dir), enable_return_routed_experts=True).generate(
            {"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), use_tqdm=False
        )[0].outputs[0]
        assert choice["token_ids"] == single.token_ids
        got = np.load(io.BytesIO(base64.b64decode(choice["routed_experts"])))
        np.testing.assert_array_equal(got, single.routed_experts)
        assert res["body"]["usage"]["prompt_token_sources"] == {
            "local_cache": 0,
            "offloaded": 0,
            "transferred": 48,
            "computed": 2,
        }
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
        time.sleep(0.2)

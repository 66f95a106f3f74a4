"""The fleet on two Ray nodes in two network namespaces joined by a veth pair (docs/fleet.md
"Several hosts").

``ray start --head --node-ip-address 10.231.9.1`` runs in one namespace, ``ray start --address
10.231.9.1:PORT --node-ip-address 10.231.9.2`` in the other, each with ``--resources
'{"execstate_engine": 1}'`` and its own ``--temp-dir``; the only link between them is the veth
pair, as between two hosts. A driver in the worker's namespace deploys the fleet (one engine
replica per node: the custom resource; replicas bind and advertise their node's address,
``replica_host=NODE_IP``; Ray Serve's proxy on the head) and sends every request across the link
to the head's proxy: completions (tokens equal a single instance's) answered by both replicas,
sessions on both, then a drain of one replica that migrates its sessions to the other namespace
(two-phase hand-over, KV through the connector's side channel on the node's address), after which
every session's next step equals a session never moved.

Teardown stops exactly the processes inside the two namespaces (never ``ray stop``, which would
stop every Ray process on the machine), then deletes the namespaces and the temp dirs. The Ray
ports are Ray's defaults or free ports *inside* these namespaces, which no other process shares.
Skipped where network namespaces cannot be made (needs root / CAP_SYS_ADMIN). Slow: two Ray
nodes and two engines start in 1-3 minutes on a loaded 2-core machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray")

sys.path.insert(0, str(Path(__file__).parent.parent / "serve"))

from serve_helpers import write_tokenizer  # noqa: E402

from execstate import LLM  # noqa: E402
from execstate.engine.sampling_params import SamplingParams  # noqa: E402
from execstate.model.random_models import make_random  # noqa: E402

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
HEAD_IP, WORKER_IP = "10.231.9.1", "10.231.9.2"
NAME, BS = "tiny-moe", 4
RAY = str(Path(sys.executable).parent / "ray")


def sh(*args: str, timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)


def ids(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 500, n).tolist()


def stop_namespace(ns: str) -> None:
    """Stop every process inside ``ns`` (ours: the namespace is this test's), SIGTERM then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 2.0)):
        pids = [int(p) for p in sh("ip", "netns", "pids", ns).stdout.split()]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while pids and time.monotonic() < deadline and sh("ip", "netns", "pids", ns).stdout.split():
            time.sleep(0.2)


@pytest.fixture(scope="module")
def hosts():
    """Two network namespaces joined by a veth pair: (head namespace, worker namespace)."""
    if shutil.which("ip") is None:
        pytest.skip("iproute2 ('ip') is not installed")
    tag = uuid.uuid4().hex[:6]
    ns_h, ns_w = f"es-rh-{tag}", f"es-rw-{tag}"
    if sh("ip", "netns", "add", ns_h).returncode != 0:
        pytest.skip("cannot create network namespaces here (needs root / CAP_SYS_ADMIN)")
    try:
        cmds = [
            ("ip", "netns", "add", ns_w),
            ("ip", "link", "add", f"vh{tag}", "type", "veth", "peer", "name", f"vw{tag}"),
            ("ip", "link", "set", f"vh{tag}", "netns", ns_h),
            ("ip", "link", "set", f"vw{tag}", "netns", ns_w),
            ("ip", "-n", ns_h, "addr", "add", f"{HEAD_IP}/24", "dev", f"vh{tag}"),
            ("ip", "-n", ns_w, "addr", "add", f"{WORKER_IP}/24", "dev", f"vw{tag}"),
            ("ip", "-n", ns_h, "link", "set", f"vh{tag}", "up"),
            ("ip", "-n", ns_w, "link", "set", f"vw{tag}", "up"),
            ("ip", "-n", ns_h, "link", "set", "lo", "up"),
            ("ip", "-n", ns_w, "link", "set", "lo", "up"),
        ]
        for c in cmds:
            r = sh(*c)
            if r.returncode != 0:
                pytest.skip(f"cannot set up the veth link ({' '.join(c)}): {r.stderr.strip()}")
        yield ns_h, ns_w
    finally:
        for ns in (ns_h, ns_w):
            stop_namespace(ns)
            sh("ip", "netns", "del", ns)


def free_port(ns: str, ip: str) -> int:
    """A port free on ``ip`` inside ``ns`` (bound to 0 there)."""
    code = f"import socket; s = socket.socket(); s.bind(({ip!r}, 0)); print(s.getsockname()[1])"
    return int(sh("ip", "netns", "exec", ns, sys.executable, "-c", code).stdout)


@pytest.fixture(scope="module")
def cluster(hosts):
    """A Ray head in the head namespace and a worker node in the other; the env every process of
    the cluster shares (a token of this test's own: Ray's token authentication)."""
    ns_h, ns_w = hosts
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=uuid.uuid4().hex, RAY_USAGE_STATS_ENABLED="0",
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               EXECSTATE_KV_SECRET="netns-fleet-secret-0123456789abcdef")
    temp = [tempfile.mkdtemp(prefix="esr"), tempfile.mkdtemp(prefix="esr")]  # short: Ray's socket paths
    try:
        gcs_port = free_port(ns_h, HEAD_IP)
        common = ["--num-cpus", "1", "--resources", json.dumps({"execstate_engine": 1}),
                  "--object-store-memory", str(80 << 20), "--disable-usage-stats"]
        head = sh("ip", "netns", "exec", ns_h, RAY, "start", "--head", "--node-ip-address", HEAD_IP, "--port",
                  str(gcs_port), "--temp-dir", temp[0], "--include-dashboard", "false", *common, timeout=180, env=env)
        assert head.returncode == 0, head.stderr[-3000:]
        worker = sh("ip", "netns", "exec", ns_w, RAY, "start", "--address", f"{HEAD_IP}:{gcs_port}",
                    "--node-ip-address", WORKER_IP, "--temp-dir", temp[1], *common, timeout=180, env=env)
        assert worker.returncode == 0, worker.stderr[-3000:]
        yield {"gcs": f"{HEAD_IP}:{gcs_port}", "env": env, "http_port": free_port(ns_h, HEAD_IP)}
    finally:
        for ns in hosts:
            stop_namespace(ns)
        for d in temp:
            shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    d = make_random("qwen3_moe", tmp_path_factory.mktemp("netns_fleet_moe"), seed=0)
    write_tokenizer(d)
    return d


DRIVER = textwrap.dedent(
    """
    import json, sys, time
    import httpx, numpy as np, ray
    from ray import serve
    from execstate.fleet.ray_app.app import NODE_IP, fleet_app

    cfg = json.loads(sys.argv[1])
    out = {}

    def ids(seed, n):
        return np.random.default_rng(seed).integers(3, 500, n).tolist()

    ray.init(address=cfg["gcs"], _node_ip_address=cfg["node_ip"], log_to_driver=False)
    try:
        serve.start(proxy_location="HeadOnly", http_options={"host": cfg["http_host"], "port": cfg["http_port"]})
        kwargs = {"enable_return_routed_experts": True, "seed": 0, "block_size": cfg["bs"]}
        serve.run(fleet_app(cfg["model"], 2, cfg["name"], kwargs, replica_cpus=0.5, replica_host=NODE_IP,
                            replica_resources={"execstate_engine": 1}), name="execstate", route_prefix="/")
        url = f"http://{cfg['http_host']}:{cfg['http_port']}"
        deadline = time.monotonic() + 120
        while len(httpx.get(url + "/v1/fleet/replicas", timeout=30).json()["replicas"]) < 2:
            assert time.monotonic() < deadline, "the replicas did not register"
            time.sleep(0.3)
        out["replicas"] = httpx.get(url + "/v1/fleet/replicas", timeout=30).json()["replicas"]
        out["completions"] = []
        for seed in range(16):  # until both replicas answered (the router has no prefix to follow)
            r = httpx.post(url + "/v1/completions", json={"model": cfg["name"], "prompt": ids(seed, 13),
                           "max_tokens": 5, "temperature": 0, "ignore_eos": True, "return_token_ids": True},
                           timeout=120)
            out["completions"].append({"seed": seed, "status": r.status_code, "replica": r.headers.get(
                "x-execstate-replica"), "token_ids": r.json()["choices"][0]["token_ids"] if r.status_code == 200
                else r.text})
            if seed >= 3 and len({c["replica"] for c in out["completions"]}) == 2:
                break
        sampling = {"temperature": 0, "max_tokens": 4, "ignore_eos": True}
        sessions = []
        for i in range(6):  # until both replicas hold sessions
            r = httpx.post(url + "/v1/sessions", json={"sampling": sampling}, timeout=60)
            sid = r.json()["session_id"]
            step = httpx.post(f"{url}/v1/sessions/{sid}/step", json={"input": ids(70 + i, 10)}, timeout=60)
            sessions.append({"i": i, "sid": sid, "home": r.headers["x-execstate-replica"],
                             "first": step.json()["token_ids"], "first_replica": step.headers["x-execstate-replica"]})
            if i >= 1 and len({s["home"] for s in sessions}) == 2:
                break
        out["sessions"] = sessions
        victim = sessions[0]["home"]
        t0 = time.monotonic()
        out["drain"] = httpx.post(url + "/v1/fleet/drain", json={"replica": victim}, timeout=300).json()
        out["drain_s"] = time.monotonic() - t0
        for s in sessions:
            step = httpx.post(f"{url}/v1/sessions/{s['sid']}/step", json={"input": ids(80 + s["i"], 6)}, timeout=60)
            s["second_status"] = step.status_code
            s["second"] = step.json().get("token_ids") if step.status_code == 200 else step.text
            s["second_replica"] = step.headers.get("x-execstate-replica")
        out["after_drain"] = [httpx.post(url + "/v1/completions", json={"model": cfg["name"], "prompt": ids(90, 12),
                              "max_tokens": 3, "temperature": 0, "ignore_eos": True}, timeout=60).headers.get(
                              "x-execstate-replica") for _ in range(3)]
    finally:
        print("RESULT " + json.dumps(out), flush=True)
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
    """
)


@pytest.mark.timeout(900)
def test_fleet_on_two_ray_nodes_in_two_network_namespaces(hosts, cluster, model_dir):
    ns_h, ns_w = hosts
    cfg = {"gcs": cluster["gcs"], "node_ip": WORKER_IP, "http_host": HEAD_IP, "http_port": cluster["http_port"],
           "model": str(model_dir), "name": NAME, "bs": BS}
    driver = subprocess.run(["ip", "netns", "exec", ns_w, sys.executable, "-c", DRIVER, json.dumps(cfg)], cwd=ROOT,
                            env=cluster["env"], capture_output=True, text=True, timeout=600)
    lines = [ln for ln in driver.stdout.splitlines() if ln.startswith("RESULT ")]
    assert driver.returncode == 0 and lines, (driver.stdout[-3000:], driver.stderr[-5000:])
    res = json.loads(lines[-1][len("RESULT "):])

    # one engine replica per node, each advertising its own namespace's address
    by_id = {r["replica_id"]: r for r in res["replicas"]}
    hosts_of = {rid: r["url"].split("//")[1].split(":")[0] for rid, r in by_id.items()}
    assert sorted(hosts_of.values()) == [HEAD_IP, WORKER_IP]
    assert all(r["kv_events"].startswith(f"tcp://{hosts_of[rid]}:") for rid, r in by_id.items())

    # completions through the head's proxy, answered by both replicas, tokens of a single instance
    offline = LLM(str(model_dir), enable_return_routed_experts=True, seed=0, block_size=BS)
    greedy = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    assert {c["replica"] for c in res["completions"]} == set(by_id)
    for c in res["completions"]:
        assert c["status"] == 200, c
        want = offline.generate({"prompt_token_ids": ids(c["seed"], 13)}, greedy, use_tqdm=False)[0].outputs[0]
        assert c["token_ids"] == want.token_ids

    # sessions on both nodes; the drain moves the victim's across the namespaces and loses nothing
    sessions, drain = res["sessions"], res["drain"]
    victim = sessions[0]["home"]
    assert {s["home"] for s in sessions} == set(by_id)
    assert drain["failed"] == [] and drain["idle"] is True, drain
    assert sorted(m["session_id"] for m in drain["moved"]) == sorted(s["sid"] for s in sessions if s["home"] == victim)
    step_params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    for s in sessions:
        ref = offline.open_session(sampling_params=step_params)
        assert s["first_replica"] == s["home"] and s["first"] == ref.step(ids(70 + s["i"], 10)).token_ids
        assert s["second_status"] == 200, s
        assert s["second_replica"] != victim  # every session now lives on the other node
        assert s["second"] == ref.step(ids(80 + s["i"], 6)).token_ids  # as if never moved
    assert victim not in res["after_drain"]  # new requests avoid the drained replica
    print(f"two-node fleet: {len(res['completions'])} completions on 2 nodes, {len(sessions)} sessions, drain of "
          f"{len(drain['moved'])} across the link in {res['drain_s']:.2f} s")

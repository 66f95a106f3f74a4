"""The fleet under change and failure (a local Ray cluster, 2 replicas of the tiny MoE):

- a rolling ``POST /v1/fleet/update_weights`` while requests run: every answer's tokens are
  exactly one version's (the single-instance tokens of v0 or of v1, never a mix), the version the
  answer names; after the update the router's hit for a prefix cached under v0 is 0 (computed by
  the router core on the indexes rebuilt from the replicas' KV events) though the blocks are
  still indexed, and the engine hits none of them;
- a replica SIGKILLed (its PID from its registration) while streams run on it: those streams end
  with a clear ``replica_failed`` error event, the other replica's streams finish, every request
  sent after the kill succeeds (a request that reached the dead replica before it answered is
  retried elsewhere), and Ray's replacement replica registers and serves; built from the
  deployment's arguments (v0), it is switched to the fleet's updated weights (v1) before it
  answers, and every answer after the kill names v1.

Slow (Ray and two engines; the kill waits for Ray to replace the replica)."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

pytest.importorskip("ray")

sys.path.insert(0, str(Path(__file__).parent.parent / "serve"))

from kv_events_client import replay_all  # noqa: E402
from ray_fleet_helpers import local_fleet, registered  # noqa: E402
from serve_helpers import write_tokenizer  # noqa: E402

from execstate import LLM  # noqa: E402
from execstate.engine.sampling_params import SamplingParams  # noqa: E402
from execstate.fleet.router.block_index import ReplicaIndex  # noqa: E402
from execstate.fleet.router.policy import FleetRouter, ReplicaView, RouteRequest  # noqa: E402
from execstate.identity.provenance import Provenance  # noqa: E402
from execstate.model.random_models import make_random  # noqa: E402
from execstate.state.kv_events.events import BlockStored, decode_batch  # noqa: E402

pytestmark = pytest.mark.slow
NAME = "tiny-moe"
BS = 4
REPLICA, VERSION = "x-execstate-replica", "x-execstate-weights-version"
NEW = "user:v1"  # a supplied weights version is namespaced (engine/weight_update.py)


def ids(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 500, n).tolist()


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path]:
    v0 = make_random("qwen3_moe", tmp_path_factory.mktemp("faults_v0"), seed=0)
    v1 = make_random("qwen3_moe", tmp_path_factory.mktemp("faults_v1"), seed=1)  # same shapes, other weights
    write_tokenizer(v0)
    return v0, v1


@pytest.fixture(scope="module")
def fleet(models):
    from execstate.fleet.ray_app.app import fleet_app

    kwargs = {"seed": 0, "block_size": BS}
    with local_fleet(lambda: fleet_app(str(models[0]), 2, NAME, kwargs, replica_cpus=0.5), 2) as url:
        yield url


def complete(url: str, prompt: list[int], max_tokens: int = 4) -> httpx.Response:
    return httpx.post(url + "/v1/completions", json={"model": NAME, "prompt": prompt, "max_tokens": max_tokens,
                                                     "temperature": 0, "ignore_eos": True, "return_token_ids": True},
                      timeout=120)


def reference(path: Path, prompts: list[list[int]]) -> list[list[int]]:
    llm = LLM(str(path), seed=0, block_size=BS)
    greedy = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], greedy,
                                                         use_tqdm=False)]


def test_rolling_update_never_mixes_versions_and_never_hits_the_old_version(fleet, models):
    traffic_prefix, kept_prefix = ids(1, 24), ids(2, 24)  # 6 blocks each
    prompts = [traffic_prefix + ids(100 + i, 3) for i in range(24)]
    want = {"v0": reference(models[0], prompts), "v1": reference(models[1], prompts)}
    assert want["v0"] != want["v1"]
    kept = kept_prefix + ids(3, 3)
    assert complete(fleet, kept).status_code == 200  # cached under v0 on one replica
    assert complete(fleet, prompts[0]).headers[VERSION] != NEW
    old_provenance = {r["replica_id"]: _provenance(r["replica_id"]) for r in registered(fleet, 2)}
    answers: list[tuple[int, httpx.Response]] = []
    stop = threading.Event()

    def traffic() -> None:
        i = 0
        while not stop.is_set() or i < 4:
            answers.append((i % len(prompts), complete(fleet, prompts[i % len(prompts)])))
            i += 1

    with ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(traffic) for _ in range(2)]
        time.sleep(0.5)
        update = httpx.post(fleet + "/v1/fleet/update_weights", json={"source": str(models[1]),
                                                                      "weights_version": "v1"}, timeout=300)
        stop.set()
        for r in runs:
            r.result()
    assert update.status_code == 200, update.text
    assert set(update.json()["versions"].values()) == {NEW}
    served = {"v0": 0, "v1": 0}
    for i, r in answers:
        assert r.status_code == 200, r.text
        version = r.headers[VERSION]
        got = r.json()["choices"][0]["token_ids"]
        assert got == (want["v1"][i] if version == NEW else want["v0"][i]), (version, i)  # one version's tokens
        served["v1" if version == NEW else "v0"] += 1
    assert served["v0"] > 0 and served["v1"] > 0, served  # the traffic saw both versions

    # the router's view: the kept prefix's v0 blocks are still in a replica's index (rebuilt from its
    # KV events), yet under the replicas' v1 provenance the router core scores them 0
    info = httpx.get(fleet + "/v1/fleet/replicas").json()["replicas"]
    assert {r["weights_version"] for r in info} == {NEW}  # the list shows what the replicas run now
    views, old_hits, stored_versions = [], 0, set()
    for rep in info:
        index = ReplicaIndex()
        for seq, payload in replay_all(rep["kv_replay"]):
            batch = decode_batch(payload)
            index.apply(seq, batch)
            stored_versions |= {e.weights_version for e in batch.events if isinstance(e, BlockStored)}
        prov = Provenance(**_provenance(rep["replica_id"]))
        assert prov.weights_version == NEW
        views.append(ReplicaView(rep["replica_id"], 0, 0.0, prov, BS, index))
        old = ReplicaView(rep["replica_id"], 0, 0.0, Provenance(**old_provenance[rep["replica_id"]]), BS, index)
        old_hits += FleetRouter().hits(RouteRequest(tuple(kept)), [old])[rep["replica_id"]] > 0
    assert stored_versions == {NEW} | {p["weights_version"] for p in old_provenance.values()}  # events name both
    assert old_hits >= 1  # the v0 blocks are indexed ...
    assert set(FleetRouter().hits(RouteRequest(tuple(kept)), views).values()) == {0.0}  # ... and count for nothing
    again = complete(fleet, kept)
    assert again.headers[VERSION] == NEW
    assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def _provenance(replica_id: str) -> dict:
    from ray import serve

    from execstate.fleet.ray_app.app import ENGINES

    handle = serve.get_deployment_handle(ENGINES, "execstate")
    return handle.describe.remote(RouteRequest(session_replica=replica_id)).result(timeout_s=30)["provenance"]


def test_a_replica_killed_mid_load(fleet, models):
    info = registered(fleet, 2)
    if {r["weights_version"] for r in info} != {NEW}:  # run alone: update first, as the test above does
        update = httpx.post(fleet + "/v1/fleet/update_weights", json={"source": str(models[1]),
                                                                      "weights_version": "v1"}, timeout=300)
        assert update.status_code == 200, update.text
        info = registered(fleet, 2)
    body = {"model": NAME, "prompt": ids(7, 12), "max_tokens": 120, "temperature": 0, "ignore_eos": True,
            "stream": True}
    results: list[tuple[str, str, bool]] = []  # (replica, error message or "", finished with [DONE])
    homes: list[str] = []
    started = threading.Barrier(7)

    def stream(k: int) -> None:
        with httpx.stream("POST", fleet + "/v1/completions", json={**body, "prompt": ids(10 + k, 12)},
                          timeout=120) as r:
            homes.append(r.headers[REPLICA])
            err, done, first = "", False, True
            for line in r.iter_lines():
                if first and line.startswith("data: "):
                    first = False
                    started.wait(60)
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: ") and "error" in (data := json.loads(line[6:])):
                    err = data["error"]["message"] + " | " + data["error"]["type"]
            results.append((r.headers[REPLICA], err, done))

    with ThreadPoolExecutor(6) as pool:
        runs = [pool.submit(stream, k) for k in range(6)]
        started.wait(60)  # every stream has its first tokens: all are running
        by_id = {r["replica_id"]: r for r in info}
        victim = max(by_id, key=homes.count)  # the replica running the most streams
        os.kill(by_id[victim]["pid"], signal.SIGKILL)
        t_kill = time.monotonic()
        after = [complete(fleet, ids(200 + i, 10)) for i in range(8)]  # sent after the kill, none started
        for f in runs:
            f.result()
    assert all(r.status_code == 200 for r in after), [r.text for r in after if r.status_code != 200]
    assert {r.headers[VERSION] for r in after} == {NEW}
    assert {r.headers[REPLICA] for r in after} != {victim}
    on_victim = [x for x in results if x[0] == victim]
    elsewhere = [x for x in results if x[0] != victim]
    assert on_victim and elsewhere
    for _, err, done in on_victim:
        assert not done and "failed mid-answer" in err and "replica_failed" in err
    assert all(done and not err for _, err, done in elsewhere)
    deadline = time.monotonic() + 120
    while not [r for r in registered(fleet, 1) if r["replica_id"] not in by_id]:
        assert time.monotonic() < deadline, "Ray did not replace the killed replica"
        time.sleep(0.5)
    listed = {r["replica_id"] for r in registered(fleet, 2)}
    assert victim not in listed and len(listed) == 2  # the dead replica is forgotten, its replacement listed
    recovery_s = time.monotonic() - t_kill
    while True:  # the replacement started on v0 (the deployment's weights) and is switched to v1
        now = httpx.get(fleet + "/v1/fleet/replicas").json()["replicas"]
        if {r["weights_version"] for r in now} == {NEW} and not any(r["draining"] for r in now):
            break
        assert time.monotonic() < deadline, f"the replacement was not switched to the fleet's weights: {now}"
        time.sleep(0.5)
    switched_s = time.monotonic() - t_kill
    served = [complete(fleet, ids(300 + i, 10)) for i in range(6)]  # the fleet serves on, the replacement included
    assert all(r.status_code == 200 and r.headers[VERSION] == NEW for r in served), \
        [(r.status_code, r.headers.get(VERSION)) for r in served]
    assert {r["replica_id"] for r in now} == listed
    print(f"replacement registered {recovery_s:.1f} s after the kill, on v1 after {switched_s:.1f} s; retried "
          f"{httpx.get(fleet + '/v1/fleet/replicas').json()['retried']}")

"""PD as two Ray Serve deployments: 1 prefill + 2 decode replicas of the tiny MoE behind the PD
ingress, both stages routed by the execstate router. Token ids and routes (R3) equal a single
instance's, with the KV really transferred; SSE streams; a second request sharing a prefix is a
prefix hit on the prefill replica and on the decode replica the router chose (the one that cached
it); sessions go to the decode replicas; a request never pairs two weights versions (it waits for a
pair while the roles disagree), and a rolling update over both deployments ends on one version.

Slow: a local Ray cluster and three engines (about 1-2 min on the loaded 2-core machine)."""

from __future__ import annotations

import base64
import io
import json
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

pytest.importorskip("ray")

sys.path.insert(0, str(Path(__file__).parent.parent / "serve"))

from ray_fleet_helpers import local_fleet  # noqa: E402
from serve_helpers import write_tokenizer  # noqa: E402

from execstate import LLM  # noqa: E402
from execstate.engine.sampling_params import SamplingParams  # noqa: E402
from execstate.model.random_models import make_random  # noqa: E402

pytestmark = pytest.mark.slow
NAME = "tiny-moe"
BS = 4
REPLICA, VERSION = "x-execstate-replica", "x-execstate-weights-version"
PREFILL, DECODE = "x-execstate-prefill-replica", "x-execstate-decode-replica"
SOURCES = "x-execstate-prefill-sources"
GREEDY = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)


def ids(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 500, n).tolist()


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path]:
    v0 = make_random("qwen3_moe", tmp_path_factory.mktemp("pd_v0"), seed=0)
    v1 = make_random("qwen3_moe", tmp_path_factory.mktemp("pd_v1"), seed=1)  # same shapes, other weights
    write_tokenizer(v0)
    return v0, v1


@pytest.fixture(scope="module")
def offline(models) -> LLM:
    return LLM(str(models[0]), enable_return_routed_experts=True, seed=0, block_size=BS)


@pytest.fixture(scope="module")
def fleet(models):
    from execstate.fleet.ray_app.app import fleet_app

    kwargs = {"enable_return_routed_experts": True, "seed": 0, "block_size": BS}
    with local_fleet(lambda: fleet_app(str(models[0]), served_model_name=NAME, engine_kwargs=kwargs,
                                       replica_cpus=0.5, pd=(1, 2)), 3, 120) as url:
        yield url


def complete(url: str, prompt: list[int], max_tokens: int = 5, **kw) -> httpx.Response:
    r = httpx.post(url + "/v1/completions", json={"model": NAME, "prompt": prompt, "max_tokens": max_tokens,
                                                 "temperature": 0, "ignore_eos": True, "return_token_ids": True,
                                                 **kw}, timeout=180)
    assert r.status_code == 200, r.text
    return r


def sources(r: httpx.Response) -> tuple[dict, dict]:
    """(the prefill replica's prompt token sources, the decode replica's)."""
    return json.loads(r.headers[SOURCES]), r.json()["usage"]["prompt_token_sources"]


def test_tokens_and_routes_equal_a_single_instance(fleet, offline):
    listed = httpx.get(fleet + "/v1/fleet/replicas").json()["replicas"]
    assert sorted(r["role"] for r in listed) == ["decode", "decode", "prefill"]
    version = offline.engine.provenance.weights_version
    for seed in range(3):
        prompt = ids(seed, 30)  # 7 blocks can move
        r = complete(fleet, prompt)
        want = offline.generate({"prompt_token_ids": prompt}, GREEDY, use_tqdm=False)[0].outputs[0]
        choice = r.json()["choices"][0]
        assert choice["token_ids"] == want.token_ids
        routes = np.load(io.BytesIO(base64.b64decode(choice["routed_experts"])))
        np.testing.assert_array_equal(routes, want.routed_experts)
        assert r.headers[PREFILL].startswith("SERVE_REPLICA::execstate#PrefillReplica#")
        assert r.headers[DECODE].startswith("SERVE_REPLICA::execstate#DecodeReplica#")
        assert r.headers[REPLICA] == r.headers[DECODE] and r.headers[VERSION] == version
        p_src, d_src = sources(r)
        assert p_src["computed"] == 30  # nothing cached on the prefill replica yet
        assert d_src == {"local_cache": 0, "offloaded": 0, "transferred": 28, "computed": 2}  # the KV came from P


def test_completions_and_chat_stream_as_sse(fleet, offline):
    prompt = ids(7, 22)
    want = offline.generate({"prompt_token_ids": prompt}, GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    with httpx.stream("POST", fleet + "/v1/completions", timeout=180, json={
            "model": NAME, "prompt": prompt, "max_tokens": 5, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True, "stream": True}) as s:
        assert s.status_code == 200 and s.headers["content-type"].startswith("text/event-stream")
        assert s.headers[PREFILL] and s.headers[DECODE]
        lines = list(s.iter_lines())
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert [t for e in events for c in e["choices"] for t in c.get("token_ids") or []] == want
    assert "data: [DONE]" in lines
    body = {"model": NAME, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 6,
            "temperature": 0, "ignore_eos": True}
    whole = httpx.post(fleet + "/v1/chat/completions", json=body, timeout=180).json()["choices"][0]["message"]
    parts = []
    with httpx.stream("POST", fleet + "/v1/chat/completions", json={**body, "stream": True}, timeout=180) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                parts += [c["delta"].get("content") or "" for c in json.loads(line[6:])["choices"]]
    assert "".join(parts) == whole["content"] and whole["content"]


def test_a_shared_prefix_hits_on_the_replicas_the_router_chose(fleet):
    for system_seed in (100, 200, 300):
        system = ids(system_seed, 40)  # 10 blocks
        first = complete(fleet, system + ids(system_seed + 1, 5))
        assert sources(first)[1]["transferred"] == 44  # 11 blocks moved P -> D
        home = first.headers[DECODE]
        time.sleep(0.5)  # the decode replica's KV events reach the router's index
        # power of two would pick each decode replica half the time: 4 in a row by chance is 1 in 16
        for i in range(4):
            r = complete(fleet, system + ids(system_seed + 2 + i, 5))
            p_src, d_src = sources(r)
            assert r.headers[DECODE] == home
            assert p_src["local_cache"] == 40  # the system prompt is cached on the prefill replica
            # ... and on the decode replica that already holds it: only the new block moves
            assert d_src == {"local_cache": 40, "offloaded": 0, "transferred": 4, "computed": 1}


def test_sessions_go_to_a_decode_replica(fleet, offline):
    sampling = {"temperature": 0, "max_tokens": 4, "ignore_eos": True}
    opened = httpx.post(fleet + "/v1/sessions", json={"sampling": sampling}, timeout=120)
    assert opened.status_code == 200, opened.text
    sid, home = opened.json()["session_id"], opened.headers[REPLICA]
    assert "#DecodeReplica#" in home
    ref = offline.open_session(sampling_params=SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    for i in range(3):
        step = ids(60 + i, 9)
        r = httpx.post(f"{fleet}/v1/sessions/{sid}/step", json={"input": step}, timeout=120)
        assert r.status_code == 200 and r.headers[REPLICA] == home, r.text
        assert r.json()["token_ids"] == ref.step(step).token_ids
    assert httpx.delete(f"{fleet}/v1/sessions/{sid}", timeout=60).status_code == 200


def _update(deployment: str, replica_id: str, source: Path, version: str) -> str:
    from ray import serve

    from execstate.fleet.router.policy import RouteRequest

    handle = serve.get_deployment_handle(deployment, "execstate")
    return handle.update_weights.remote(RouteRequest(session_replica=replica_id), str(source), version).result(
        timeout_s=300)


def test_a_pair_never_mixes_weights_versions(fleet, models):
    """Last in this module: it changes the replicas' weights."""
    listed = httpx.get(fleet + "/v1/fleet/replicas").json()["replicas"]
    prefill = [r["replica_id"] for r in listed if r["role"] == "prefill"]
    decode = [r["replica_id"] for r in listed if r["role"] == "decode"]
    for rid in decode:  # the decode replicas switch to v1; the prefill replica is still on v0
        assert _update("DecodeReplica", rid, models[1], "v1") == "user:v1"
    prompt = ids(400, 30)
    answer: dict[str, object] = {}

    def send() -> None:
        answer["response"] = complete(fleet, prompt)
        answer["at"] = time.monotonic()

    waiting = threading.Thread(target=send)
    waiting.start()
    time.sleep(3.0)  # the request waits: no prefill replica runs a version a decode replica runs
    assert "response" not in answer
    switched = time.monotonic()
    assert _update("PrefillReplica", prefill[0], models[1], "v1") == "user:v1"
    waiting.join(120)
    r = answer["response"]
    assert isinstance(r, httpx.Response) and answer["at"] >= switched
    single_v1 = LLM(str(models[1]), seed=0, block_size=BS)
    want_v1 = single_v1.generate({"prompt_token_ids": prompt}, GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    assert r.json()["choices"][0]["token_ids"] == want_v1 and r.headers[VERSION] == "user:v1"
    assert sources(r)[1]["transferred"] == 28  # the decode replica accepted P's KV: keys of its own version
    # a rolling update through the fleet over both deployments ends with every replica on one version
    rolled = httpx.post(fleet + "/v1/fleet/update_weights", json={"source": str(models[0]), "weights_version": "v2"},
                        timeout=600)
    assert rolled.status_code == 200, rolled.text
    assert rolled.json()["versions"] == {rid: "user:v2" for rid in prefill + decode}
    r = complete(fleet, ids(401, 30))
    single_v0 = LLM(str(models[0]), seed=0, block_size=BS)
    want_v0 = single_v0.generate({"prompt_token_ids": ids(401, 30)}, GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    assert r.json()["choices"][0]["token_ids"] == want_v0 and r.headers[VERSION] == "user:v2"
    assert sources(r)[1]["transferred"] == 28

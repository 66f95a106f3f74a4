"""The fleet on a local Ray cluster: 2 engine replicas of the tiny MoE behind the ingress and the
execstate RequestRouter. Tokens equal a single-instance run; a prompt sharing a cached prefix goes
to the replica holding it; a session's steps all land on its replica; SSE streams through; a drain
migrates the live sessions (two-phase) and their next steps equal a session never moved.

Slow (Ray and two engines start in about 20 s idle, over a minute on a loaded 2-core machine)."""

from __future__ import annotations

import json
import sys
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
HEADER = "x-execstate-replica"


def ids(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 500, n).tolist()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    d = make_random("qwen3_moe", tmp_path_factory.mktemp("fleet_ray_moe"), seed=0)
    write_tokenizer(d)
    return d


@pytest.fixture(scope="module")
def offline(model_dir) -> LLM:
    return LLM(str(model_dir), enable_return_routed_experts=True, seed=0, block_size=BS)


@pytest.fixture(scope="module")
def fleet(model_dir):
    from execstate.fleet.ray_app.app import fleet_app

    kwargs = {"enable_return_routed_experts": True, "seed": 0, "block_size": BS}
    with local_fleet(lambda: fleet_app(str(model_dir), 2, NAME, kwargs, replica_cpus=0.5), 2, 60) as url:
        yield url


def complete(url: str, prompt: list[int], max_tokens: int = 5, **kw) -> httpx.Response:
    r = httpx.post(url + "/v1/completions", json={"model": NAME, "prompt": prompt, "max_tokens": max_tokens,
                                                 "temperature": 0, "ignore_eos": True, "return_token_ids": True,
                                                 **kw}, timeout=120)
    assert r.status_code == 200, r.text
    return r


def test_tokens_equal_a_single_instance(fleet, offline):
    greedy = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    for seed in range(3):
        prompt = ids(seed, 13)
        r = complete(fleet, prompt)
        want = offline.generate({"prompt_token_ids": prompt}, greedy, use_tqdm=False)[0].outputs[0]
        assert r.json()["choices"][0]["token_ids"] == want.token_ids
        assert r.headers[HEADER].startswith("SERVE_REPLICA::execstate#EngineReplica#")


def test_the_fleet_answers_its_landing_page(fleet):
    """``GET /`` is the ingress's own page (it was a 404 from a replica): the replicas that registered."""
    r = httpx.get(fleet + "/", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "2 engine replicas, on Ray Serve" in r.text and HEADER not in r.headers
    for replica in httpx.get(fleet + "/v1/fleet/replicas").json()["replicas"]:
        assert f"replica {replica['replica_id']}" in r.text


def test_a_shared_prefix_goes_to_the_replica_holding_it(fleet):
    replicas = [r["replica_id"] for r in httpx.get(fleet + "/v1/fleet/replicas").json()["replicas"]]
    assert len(replicas) == 2
    for system_seed in (100, 200, 300):
        system = ids(system_seed, 40)  # 10 blocks
        first = complete(fleet, system + ids(system_seed + 1, 3)).headers[HEADER]
        time.sleep(0.3)  # the replica's KV events reach the router's index
        # power of two would pick each replica half the time: 6 in a row by chance is 1 in 64
        served = {complete(fleet, system + ids(system_seed + 2 + i, 5)).headers[HEADER] for i in range(6)}
        assert served == {first}


def test_a_sessions_steps_all_land_on_its_replica(fleet, offline):
    opened = httpx.post(fleet + "/v1/sessions", json={"sampling": {"temperature": 0, "max_tokens": 4,
                                                                   "ignore_eos": True}}, timeout=60)
    assert opened.status_code == 200, opened.text
    sid, home = opened.json()["session_id"], opened.headers[HEADER]
    ref = offline.open_session(sampling_params=SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    for i in range(4):
        step = ids(50 + i, 9)
        r = httpx.post(f"{fleet}/v1/sessions/{sid}/step", json={"input": step}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.headers[HEADER] == home
        assert r.json()["token_ids"] == ref.step(step).token_ids
    assert httpx.delete(f"{fleet}/v1/sessions/{sid}", timeout=30).headers[HEADER] == home


def test_chat_streams_as_sse(fleet):
    body = {"model": NAME, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 6,
            "temperature": 0, "ignore_eos": True}
    whole = httpx.post(fleet + "/v1/chat/completions", json=body, timeout=60).json()["choices"][0]["message"]["content"]
    parts = []
    with httpx.stream("POST", fleet + "/v1/chat/completions", json={**body, "stream": True}, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                parts += [c["delta"].get("content") or "" for c in json.loads(line[6:])["choices"]]
    assert "".join(parts) == whole and whole


def test_drain_migrates_live_sessions_and_loses_nothing(fleet, offline):
    sampling = {"temperature": 0, "max_tokens": 4, "ignore_eos": True}
    sessions, refs = [], []
    for i in range(4):
        r = httpx.post(fleet + "/v1/sessions", json={"sampling": sampling}, timeout=60)
        sid = r.json()["session_id"]
        ref = offline.open_session(sampling_params=SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
        step = ids(70 + i, 10)
        got = httpx.post(f"{fleet}/v1/sessions/{sid}/step", json={"input": step}, timeout=60).json()["token_ids"]
        assert got == ref.step(step).token_ids
        sessions.append((sid, r.headers[HEADER]))
        refs.append(ref)
    victim = sessions[0][1]
    on_victim = [sid for sid, home in sessions if home == victim]
    drained = httpx.post(fleet + "/v1/fleet/drain", json={"replica": victim}, timeout=120).json()
    assert drained["failed"] == [] and drained["idle"] is True
    assert sorted(m["session_id"] for m in drained["moved"]) == sorted(on_victim)
    for (sid, _), ref, i in zip(sessions, refs, range(4), strict=True):
        step = ids(80 + i, 6)
        r = httpx.post(f"{fleet}/v1/sessions/{sid}/step", json={"input": step}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.headers[HEADER] != victim  # every session now lives on the other replica
        assert r.json()["token_ids"] == ref.step(step).token_ids  # the same next tokens as never moved
    for _ in range(4):  # new requests avoid the drained replica
        assert complete(fleet, ids(90, 12)).headers[HEADER] != victim
    listed = {r["replica_id"]: r for r in httpx.get(fleet + "/v1/fleet/replicas").json()["replicas"]}
    assert listed[victim]["draining"] is True

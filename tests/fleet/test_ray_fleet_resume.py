"""A lost replica's sessions resume on another replica from the shared tier (a local Ray cluster,
2 replicas of the tiny MoE, a real ``redis-server`` as every replica's shared tier, two tenants).

Sessions of tenant A are opened through the fleet and stepped twice; the replicas copy them to
Redis (``copy_every_s``); the sessions on one replica take a third step and that replica is
SIGKILLed before its next copy, while a fourth step of one of them is on it (the replica is
SIGSTOPped first, so that step is surely sent to it and unanswered). Then:

- that step, if Ray had delivered it to the replica, is answered ``503`` ``session_resumed`` with
  the step the session resumed at (never sent twice: it may have been applied before the death);
  if it was still waiting in Ray's router (a frozen replica does not answer Ray's queue probe),
  it is served by the new replica as the step after the copy;
- a request of tenant B for one of those session ids is ``not_found`` and resumes nothing;
- two requests of tenant A for one session, at once: both answered by one replica, one resume;
- every session of the dead replica continues on the other replica from exactly its copy's step
  (read from Redis after the kill: step 2; the third step is the documented loss) and its next
  steps (the third input sent again, then a fourth) give the tokens of a session that never moved
  and ran the same steps up to the copy (seeded sampling: the RNG state comes with the copy);
- the other replica's sessions are untouched.

Slow (Ray, two engines, a replica killed).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

pytest.importorskip("ray")

sys.path.insert(0, str(Path(__file__).parent.parent / "serve"))

from ray_fleet_helpers import local_fleet  # noqa: E402
from serve_helpers import write_tokenizer  # noqa: E402

from execstate.engine.sampling_params import SamplingParams  # noqa: E402
from execstate.identity.secret_ring import SecretRing  # noqa: E402
from execstate.model.random_models import make_random  # noqa: E402
from execstate.session.lm.hibernation_wire import decode_manifest  # noqa: E402
from execstate.session.lm.llm import LLM  # noqa: E402
from execstate.state.tiers.manifest_keys import manifest_key  # noqa: E402
from execstate.state.tiers.manifest_store import ManifestStore  # noqa: E402

pytestmark = pytest.mark.slow
NAME = "tiny-moe"
BS = 4
REPLICA = "x-execstate-replica"
SECRET = "fleet-resume-test-secret-0123456789"
KEY_A, KEY_B = "tenant-a-key-0123456789", "tenant-b-key-0123456789"
COPY_EVERY_S = 6.0  # long enough that the third step is taken and the replica killed before the next copy
SAMPLING = {"temperature": 0.8, "top_p": 0.95, "max_tokens": 4, "ignore_eos": True}
N_SESSIONS = 6


def ids(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 500, n).tolist()


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    path = make_random("qwen3_moe", tmp_path_factory.mktemp("resume_model"), seed=0)
    write_tokenizer(path)
    return path


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    from execstate_bench.redis_server import RedisServer, redis_server_available

    if not redis_server_available():
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed (apt-get install redis-server)")
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    server = RedisServer(tmp_path_factory.mktemp("resume_redis")).start()
    yield server.url
    server.kill()


@pytest.fixture(scope="module")
def fleet(model, redis_url, tmp_path_factory):
    from execstate.fleet.ray_app.app import fleet_app
    from execstate.fleet.ray_app.session_settings import SessionSettings

    keys = tmp_path_factory.mktemp("resume_keys") / "keys.txt"
    keys.write_text(f"{KEY_A} tenant-a\n{KEY_B} tenant-b\n")
    settings = SessionSettings(hibernate_after_s=None, copy_every_s=COPY_EVERY_S, api_keys_file=str(keys))
    with local_fleet(lambda: fleet_app(str(model), 2, NAME, {"seed": 0, "block_size": BS}, replica_cpus=0.5,
                                       secret=SECRET, shared_tier=redis_url, sessions=settings), 2, 120) as url:
        yield url


def step(url: str, sid: str, inp: list[int], key: str = KEY_A) -> httpx.Response:
    return httpx.post(f"{url}/v1/sessions/{sid}/step", json={"input": inp}, headers=auth(key), timeout=120)


def copied_step(store: ManifestStore, engine: str, sid: str) -> int | None:
    blob = store.get(manifest_key(engine, "tenant-a", sid))
    if blob is None:
        return None
    return decode_manifest(blob, SecretRing(SECRET.encode()), require_signature=True).offer.step_index


def test_a_lost_replicas_sessions_resume_elsewhere_from_their_copy(fleet, model, redis_url):
    listed = httpx.get(fleet + "/v1/fleet/replicas", headers=auth(KEY_A)).json()["replicas"]
    replicas = {r["replica_id"]: r for r in listed}
    assert all(r["shared_copies"] and r["engine_id"] for r in replicas.values())
    inputs = [ids(1, 23), ids(2, 9), ids(3, 6), ids(4, 5)]
    homes: dict[str, str] = {}
    for i in range(N_SESSIONS):
        opened = httpx.post(fleet + "/v1/sessions", json={"sampling": {**SAMPLING, "seed": 100 + i}},
                            headers=auth(KEY_A), timeout=60)
        assert opened.status_code == 200, opened.text
        homes[opened.json()["session_id"]] = opened.headers[REPLICA]
    victim = max(set(homes.values()), key=list(homes.values()).count)
    lost = [sid for sid, home in homes.items() if home == victim]
    kept = [sid for sid, home in homes.items() if home != victim]
    assert lost and kept, homes
    first: dict[str, list[list[int]]] = {}
    for sid in homes:
        first[sid] = [step(fleet, sid, inp).json()["token_ids"] for inp in inputs[:2]]

    store = ManifestStore(redis_url)
    engine = replicas[victim]["engine_id"]
    deadline = time.monotonic() + 3 * COPY_EVERY_S
    while any(copied_step(store, engine, sid) != 2 for sid in lost):  # the victim's copy of step 2
        assert time.monotonic() < deadline, "the victim did not copy its sessions"
        time.sleep(0.05)
    t_copy = time.monotonic()
    for sid in lost:  # a third step, after the copy: the documented loss
        assert step(fleet, sid, inputs[2]).headers[REPLICA] == victim
    inputs_of: dict[str, list[list[int]]] = {}
    pid = replicas[victim]["pid"]
    os.kill(pid, signal.SIGSTOP)  # frozen: the next step of one session is sent to it and gets no answer ...
    with ThreadPoolExecutor(1) as pool:
        on_it = pool.submit(step, fleet, lost[0], inputs[3])
        time.sleep(1.0)
        assert not on_it.done(), on_it.result().text
        os.kill(pid, signal.SIGKILL)  # ... and the replica dies with it
        before_next_copy = time.monotonic() - t_copy < COPY_EVERY_S - 0.5
        t_kill = time.monotonic()
        cut = on_it.result()
    at_copy = {sid: copied_step(store, engine, sid) for sid in lost[1:]}
    # Ray delivers a request to a replica only once the replica answers its queue probe: a frozen one
    # does not, so the step either waited in Ray's router (then nothing of it was applied: the session
    # is resumed and the step sent to the new replica) or, had it reached the replica, is answered
    # 503 session_resumed with the resumed step (it may have been applied before the death: never
    # sent twice)
    if cut.status_code == 503:
        assert cut.json()["error"]["type"] == "session_resumed", cut.text
        at_copy[lost[0]] = cut.json()["step_index"]
        path = "answered session_resumed"
    else:
        assert cut.status_code == 200 and cut.headers[REPLICA] != victim, cut.text
        at_copy[lost[0]] = cut.json()["step_index"] - 1
        inputs_of = {lost[0]: [*inputs[:2], inputs[3], inputs[2], inputs[3]]}  # its 4th input became step 3
        path = "sent to the new replica"
    if before_next_copy:
        assert set(at_copy.values()) == {2}  # the third step was never copied
    assert all(v in (2, 3) for v in at_copy.values()), at_copy

    other = step(fleet, lost[-1], inputs[2], KEY_B)  # tenant B: its own namespace, no such session
    assert other.status_code == 404, other.text
    resumed = httpx.get(fleet + "/v1/fleet/replicas", headers=auth(KEY_A)).json()["resumed"]
    assert [r["session_id"] for r in resumed] == [lost[0]]

    with ThreadPoolExecutor(2) as pool:  # two requests race for the resume of one session
        infos = list(pool.map(lambda _: httpx.get(f"{fleet}/v1/sessions/{lost[-1]}", headers=auth(KEY_A),
                                                  timeout=120), range(2)))
    assert [r.status_code for r in infos] == [200, 200], [r.text for r in infos]
    assert len({r.headers[REPLICA] for r in infos}) == 1 and infos[0].headers[REPLICA] != victim
    assert infos[0].json()["step_index"] == at_copy[lost[-1]]

    oracle = LLM(str(model), seed=0, block_size=BS)
    for sid in homes:
        seed = 100 + list(homes).index(sid)
        twin = oracle.open_session(sampling_params=SamplingParams(**SAMPLING, seed=seed))
        assert [twin.step(inp).token_ids for inp in inputs[:2]] == first[sid]
        resume_from = at_copy.get(sid, 2)
        if resume_from == 3:
            twin.step(inputs[2])
        mine = inputs_of.get(sid, inputs)
        if sid in inputs_of:  # the step that went to the new replica: the twin's third step
            assert cut.json()["token_ids"] == twin.step(mine[2]).token_ids
            resume_from += 1
        for k in range(resume_from, len(mine)):
            r = step(fleet, sid, mine[k])
            assert r.status_code == 200, r.text
            assert r.headers[REPLICA] != victim
            assert r.json()["step_index"] == k + 1  # continues from the copy's step
            assert r.json()["token_ids"] == twin.step(mine[k]).token_ids
    recovery_s = time.monotonic() - t_kill
    resumed = httpx.get(fleet + "/v1/fleet/replicas", headers=auth(KEY_A)).json()["resumed"]
    assert sorted(r["session_id"] for r in resumed) == sorted(lost)  # each once, none of the others
    assert all(r["from"] == victim and r["to"] != victim for r in resumed)
    assert all(copied_step(store, engine, sid) is None for sid in lost)  # claimed: nobody else can wake them
    print(f"{len(lost)} sessions resumed from step {sorted(set(at_copy.values()))} (the step on the killed "
          f"replica: {path}); resume "
          f"{max(r['seconds'] for r in resumed):.2f} s max; all steps served {recovery_s:.1f} s after the kill")

"""The schema fuzzer: schemathesis generates requests for every operation in the server's OpenAPI
schema (``GET /openapi.json``: completions, chat, the tokenizer routes, models, health, metrics,
the session API, migration and the hand-over's signed peer paths), schema-valid and not, and
sends them to a real server on the tiny model, with the API key and without it. Most requests name
the served model and a live session (``deeper``), so they get past the first check. Every answer
must come in time (no hang: a 20 s timeout per request) and be below 500; without the key, every
operation but ``/health`` and the hand-over's signed peer paths answers 401. After the fuzzing
the engine is idle with no block in use, its shared state passes its checks, and a fixed greedy
request returns the tokens it returned before.

Bounded here (``EXAMPLES`` per operation and key: about a minute on 2 cores, in the default test
set CI runs); ``SCHEMA_FUZZ_EXAMPLES=N`` runs more. What it found: a session opened with
``cache_salt: ""`` failed on the engine thread (500); now a 400 (tests/security/test_message_refusals.py).
"""

from __future__ import annotations

import os
from collections import Counter

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from serve_helpers import MODEL_NAME, running_server, wait_idle

from execstate.serve.app import build_app
from execstate.serve.principals import KeyRing
from execstate.serve.sessions.handover import PEER_PATHS  # signed server-to-server paths: no bearer key

KEY = "sk-schema-fuzz-0001"
EXAMPLES = int(os.environ.get("SCHEMA_FUZZ_EXAMPLES", "25"))
TIMEOUT_S = 20.0
PROBE = {"model": MODEL_NAME, "prompt": [5, 6, 7, 8, 9], "max_tokens": 6, "temperature": 0, "ignore_eos": True,
         "return_token_ids": True}
STATUSES: Counter[tuple[str, bool, int]] = Counter()  # (operation, with key, status)


@pytest.fixture(scope="module")
def target(served):
    app = build_app(served.engine, MODEL_NAME, keys=KeyRing.build([KEY]), sessions=served.sessions)
    with running_server(app) as (url, _):
        baseline = _probe(url)
        yield url, app, baseline


@pytest.fixture(scope="module")
def operations(target):
    """Every operation of the served schema (``GET /openapi.json``, itself behind the key)."""
    url, _, _ = target
    raw = httpx.get(url + "/openapi.json", headers=_auth(True), timeout=30).json()
    schema = schemathesis.openapi.from_dict(raw)
    schema.config.update(base_url=url)
    ops = [result.ok() for result in schema.get_all_operations()]
    assert len(ops) >= 20, [op.label for op in ops]
    return ops


def _auth(with_key: bool) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"} if with_key else {}


def _probe(url: str) -> list[int]:
    r = httpx.post(url + "/v1/completions", json=PROBE, headers=_auth(True), timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


SESSIONS = ("fuzz-0", "fuzz-1", "fuzz-2")  # opened (with the key) before the fuzzing: ids it hits
NAMED = ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize")  # bodies that name the model


@pytest.mark.parametrize("with_key", [True, False], ids=["key", "no-key"])
def test_every_operation(target, operations, with_key):
    url = target[0]
    for sid in SESSIONS:
        httpx.post(url + "/v1/sessions", json={"session_id": sid}, headers=_auth(True), timeout=30)
    for op in operations:
        @given(case=st.sampled_from(list(GenerationMode)).flatmap(op.as_strategy), aim=st.integers(0, 9))
        @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        def fuzz(case, aim: int) -> None:
            check(deeper(case, aim), with_key)

        fuzz()


def deeper(case, aim: int):
    """Mostly (8 in 10) the served model's name and a live session's id, so requests get past the
    first check and reach the engine and the sessions; else what the generator made."""
    if aim < 8:
        if case.operation.path in NAMED and isinstance(case.body, dict):
            case.body["model"] = MODEL_NAME
        if case.path_parameters and "session_id" in case.path_parameters:
            case.path_parameters["session_id"] = SESSIONS[aim % len(SESSIONS)]
    return case


def check(case, with_key: bool) -> None:
    headers = dict(case.headers or {})
    headers.pop("Authorization", None)
    headers.update(_auth(with_key))
    try:
        response = case.call(headers=headers, timeout=TIMEOUT_S)
    except Exception as e:  # a timeout is a hang: the server did not answer in time
        pytest.fail(f"{case.operation.label}: no answer within {TIMEOUT_S} s ({type(e).__name__}: {e})")
    STATUSES[case.operation.label, with_key, response.status_code] += 1
    assert response.status_code < 500, f"{case.operation.label}: {response.status_code} {response.text[:500]}"
    if not with_key and case.operation.path != "/health" and case.operation.path not in PEER_PATHS:
        assert response.status_code == 401, f"{case.operation.label} answered {response.status_code} without a key"


def test_the_fuzzed_server_is_intact(target, served):
    url, _, baseline = target
    assert STATUSES, "the fuzzer ran nothing"
    operations = {op for op, _, _ in STATUSES}
    assert len(operations) >= 20, sorted(operations)
    print(sorted(STATUSES.items()))
    assert wait_idle(served.engine, timeout=60) == (0, 0, 0)
    served.engine.call(lambda e: e.check_shared_state())
    assert _probe(url) == baseline
    assert httpx.get(url + "/health", timeout=5).status_code == 200

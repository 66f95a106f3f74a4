"""The minimal session API and session migration over HTTP, two apps in one process (each its own
engine thread, uvicorn, PD connector: real HTTP, ZeroMQ and NIXL): the migrate endpoint moves a
session to a listed target, which then steps exactly as the session would have in place; refusals
and unreachable targets leave the session served at the source; targets outside the allow-list
are refused before anything is sent; the import endpoint takes no API key but a signature."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import msgspec
import numpy as np
import pytest
from serve_helpers import engine_config, free_port, running_server

from execstate import LLM, SamplingParams
from execstate.engine.async_engine import AsyncEngine
from execstate.engine.llm_engine import LLMEngine
from execstate.engine.pd_connector import PDConfig
from execstate.serve.app import build_app
from execstate.session.lm.migration_wire import SignedOffer

KEY = "session-http-api-key"
SECRET = "session-http-test-secret-0123456789"
AUTH = {"authorization": f"Bearer {KEY}"}
SAMPLING = {"temperature": 0.8, "seed": 5, "max_tokens": 6, "ignore_eos": True}


def ids(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 500, n).tolist()


A, B, C = ids(60, 37), ids(61, 6), ids(62, 9)


DEAD = f"http://127.0.0.1:{free_port()}"  # listed, nothing listens there


@pytest.fixture(scope="module")
def pair(model_dir) -> Iterator[tuple[str, str, list[AsyncEngine]]]:
    with ExitStack() as stack:
        engines = [AsyncEngine(LLMEngine(engine_config(
            model_dir, kv_transfer=PDConfig(role="kv_both", secret=SECRET, timeout_s=3.0)))) for _ in range(2)]
        # the ports are probed after the engines' connectors bound theirs (a port probed before
        # could be handed to a connector's socket: "address already in use" in a suite run)
        ports = [free_port(), free_port()]
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        for i, eng in enumerate(engines):
            app = build_app(eng, "m", api_key=KEY, migration_targets=[urls[1 - i], DEAD])
            stack.enter_context(running_server(app, ports[i]))
        yield urls[0], urls[1], engines
        for eng in engines:
            eng.call(lambda e: e.pd.close())
            eng.shutdown()


def post(url: str, body: dict | None = None, **kw) -> httpx.Response:
    return httpx.post(url, json=body, headers=AUTH, timeout=60, **kw)


def open_and_step(base: str, sid: str, inputs: list[list[int]]) -> list[dict]:
    r = post(f"{base}/v1/sessions", {"session_id": sid, "sampling": SAMPLING})
    assert r.status_code == 200, r.text
    return [step(base, sid, x) for x in inputs]


def step(base: str, sid: str, x: list[int]) -> dict:
    r = post(f"{base}/v1/sessions/{sid}/step", {"input": x, "return_routes": True})
    assert r.status_code == 200, r.text
    return r.json()


def rows(b64: str) -> np.ndarray:
    return np.load(io.BytesIO(base64.b64decode(b64)))


@pytest.fixture(scope="module")
def reference(model_dir):
    s = LLM(str(model_dir), enable_return_routed_experts=True, seed=0).open_session(
        sampling_params=SamplingParams(**SAMPLING))
    return [s.step(x) for x in (A, B, C)], s


def test_migrate_over_http_then_step_on_the_target(pair, reference):
    src, dst, _ = pair
    want, ref = reference
    got = open_and_step(src, "http-1", [A, B])
    assert [g["token_ids"] for g in got] == [w.token_ids for w in want[:2]]
    r = post(f"{src}/v1/sessions/http-1/migrate", {"target": dst})
    assert r.status_code == 200, r.text
    m = r.json()
    assert (m["status"], m["committed"], m["target"], m["session_id"], m["num_tokens"], m["blocks_transferred"],
            m["tokens_recomputed"], m["checkpoints_dropped"]) == ("migrated", True, dst, "http-1", 55, 3, 6, 0)
    assert m["seconds"] >= m["target_seconds"] > 0
    assert httpx.get(f"{src}/v1/sessions/http-1", headers=AUTH).json()["status"] == "closed"
    c = step(dst, "http-1", C)  # the client reconnects to the target with the same id
    assert c["token_ids"] == want[2].token_ids and c["step_index"] == 3
    assert rows(c["routed_experts"]).tobytes() == want[2].routed_experts.tobytes()
    info = httpx.get(f"{dst}/v1/sessions/http-1", params={"routes": "true"}, headers=AUTH).json()
    assert info["token_ids"] == ref.token_ids
    assert rows(info["routed_experts"]).tobytes() == ref.routed_experts.tobytes()
    assert httpx.delete(f"{dst}/v1/sessions/http-1", headers=AUTH).json()["closed"]


def test_refused_or_unreachable_target_leaves_the_session_served(pair):
    src, dst, engines = pair
    open_and_step(src, "http-2", [A])
    assert post(f"{dst}/v1/sessions", {"session_id": "http-2"}).status_code == 200  # the id is taken there
    r = post(f"{src}/v1/sessions/http-2/migrate", {"target": dst})
    assert r.status_code == 502 and r.json()["error"]["code"] == "conflict", r.text
    assert "still served here" in r.json()["error"]["message"]
    r = post(f"{src}/v1/sessions/http-2/migrate", {"target": DEAD})  # listed, down: identify fails first
    assert r.status_code == 502 and r.json()["error"]["code"] == "unreachable"
    r = post(f"{src}/v1/sessions/http-2/migrate", {"target": dst, "target_api_key": "wrong"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "target_api_key"  # no credential is forwarded
    assert len(step(src, "http-2", B)["token_ids"]) == 6  # served at the source
    for bad in ("ftp://x:1", "http://h:1/path", "nonsense", f"http://127.0.0.1:{free_port()}"):
        r = post(f"{src}/v1/sessions/http-2/migrate", {"target": bad})
        assert r.status_code == 403 and r.json()["error"]["code"] == "target_not_allowed"
    assert post(f"{src}/v1/sessions/nope/migrate", {"target": dst}).json()["error"]["code"] == "not_found"
    for url in (src, dst):
        httpx.delete(f"{url}/v1/sessions/http-2", headers=AUTH)
    src_eng = engines[0]
    assert src_eng.call(lambda e: (e.pd.num_pinned_exports, e.kv_holds.num_holders)) == (0, 0)


def test_the_import_endpoint_checks_who_sends(pair):
    _, dst, _ = pair
    url = f"{dst}/v1/sessions/import"
    r = httpx.post(url, content=b"not msgpack")  # no API key: a signature is what counts here
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid"
    for body in (SignedOffer(b"\x80", "0" * 64), SignedOffer(b"\x80", None)):  # forged, unsigned
        r = httpx.post(url, content=msgspec.msgpack.encode(body), headers=AUTH)
        assert r.status_code == 403 and r.json()["error"]["code"] == "unauthorized"
    for path in ("commit", "abort", "identify"):
        r = httpx.post(f"{url}/{path}", content=msgspec.msgpack.encode(SignedOffer(b"\x80", "0" * 64)))
        assert r.status_code == 403 and r.json()["error"]["code"] == "unauthorized"
    assert httpx.get(f"{url}/commit").status_code == 401  # any other /v1 call still needs the key

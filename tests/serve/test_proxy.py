"""The PD proxy against fake prefill/decode servers (real HTTP on 127.0.0.1): what it forwards,
its error bodies, its /metrics and its per-request log line."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client.parser import text_string_to_metric_families
from serve_helpers import free_port

from execstate.identity.secret_ring import SecretRing
from execstate.serve.pd.proxy import build_proxy_app
from execstate.transfer.handoff import Handoff

SECRET = b"proxy-test-secret-0123456789abcdef"
HANDOFF = Handoff("p0", "tcp://127.0.0.1:5999", "p0/t1", 0, 2, 16, 2**40)


@dataclass
class Fake:
    """What a fake instance received and how it answers next."""

    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    reply: Any = None  # a Response, or None for the default


def run_app(app) -> tuple[str, uvicorn.Server, threading.Thread]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive()
        time.sleep(0.02)
    return f"http://127.0.0.1:{port}", server, thread


def fake_instance(fake: Fake, default) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        fake.bodies.append(await request.json())
        fake.headers.append(dict(request.headers))
        return fake.reply if fake.reply is not None else default(fake.bodies[-1])

    @app.get("/health")
    async def health() -> Response:
        return JSONResponse({"status": "ok"})

    return app


def p_default(body: dict) -> Response:
    return JSONResponse({"choices": [{"text": "x"}], "kv_transfer_params": HANDOFF.to_params(SecretRing(SECRET))})


def d_default(body: dict) -> Response:
    if body.get("stream"):
        async def events():
            for i in range(3):
                yield f"data: {json.dumps({'choices': [{'text': str(i)}]})}\n\n"
            yield "data: [DONE]\n\n"
        return StreamingResponse(events(), media_type="text/event-stream")
    return JSONResponse({"choices": [{"text": "decoded"}], "usage": {}})


@pytest.fixture(scope="module")
def setup() -> Iterator[dict[str, Any]]:
    p, d = Fake(), Fake()
    p_url, p_srv, p_th = run_app(fake_instance(p, p_default))
    d_url, d_srv, d_th = run_app(fake_instance(d, d_default))
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    proxy = build_proxy_app([p_url], [d_url], timeout_s=10.0, secret=SECRET)
    x_url, x_srv, x_th = run_app(proxy)
    broken = build_proxy_app([dead], [d_url], timeout_s=5.0, secret=SECRET)
    b_url, b_srv, b_th = run_app(broken)
    yield {"p": p, "d": d, "x": x_url, "broken": b_url}
    for srv, th in ((x_srv, x_th), (b_srv, b_th), (p_srv, p_th), (d_srv, d_th)):
        srv.should_exit = True
        th.join(10)


@pytest.fixture(autouse=True)
def reset(setup):
    setup["p"].reply = setup["d"].reply = None
    yield


def metrics(url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(url + "/metrics", timeout=5).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def fail_count(m, stage: str) -> float:
    return m[("execstate_proxy_failures_total", (("stage", stage),))]


def assert_openai_error(r: httpx.Response, status: int, code: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and isinstance(err["message"], str)
    if code is not None:
        assert err["code"] == code
    return err


def test_forwards_only_ps_handoff_and_logs(setup, caplog):
    caplog.set_level(logging.INFO, logger="execstate.proxy")
    before = metrics(setup["x"])
    client_kv = {"do_remote_prefill": True, "remote_addr": "tcp://6.6.6.6:1", "remote_engine_id": "evil"}
    body = {"model": "m", "prompt": "hi", "max_tokens": 5, "kv_transfer_params": client_kv}
    r = httpx.post(setup["x"] + "/v1/completions", json=body, timeout=10)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "decoded"
    p_body, d_body = setup["p"].bodies[-1], setup["d"].bodies[-1]
    assert p_body["kv_transfer_params"] == {"do_remote_decode": True} and p_body["max_tokens"] == 1
    assert d_body["kv_transfer_params"] == HANDOFF.to_params(SecretRing(SECRET)) and d_body["max_tokens"] == 5
    rid = setup["p"].headers[-1]["x-request-id"]
    assert rid.startswith("proxy-") and setup["d"].headers[-1]["x-request-id"] == rid
    (line,) = [rec.getMessage() for rec in caplog.records if rid in rec.getMessage()]
    assert "status=200" in line and "failed_stage=-" in line and "prefill=http://127.0.0.1:" in line
    assert "prefill_s=0." in line and "decode_s=0." in line
    after = metrics(setup["x"])
    assert after[("execstate_proxy_requests_total", (("endpoint", "completions"),))] == \
        before[("execstate_proxy_requests_total", (("endpoint", "completions"),))] + 1
    for h in ("prefill", "decode"):
        key = (f"execstate_proxy_{h}_seconds_count", ())
        assert after[key] == before[key] + 1


def test_streaming_is_relayed_and_timed(setup):
    before = metrics(setup["x"])
    with httpx.stream("POST", setup["x"] + "/v1/completions", json={"model": "m", "prompt": "hi", "stream": True},
                      timeout=10) as s:
        assert s.status_code == 200
        lines = [line for line in s.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and len(lines) == 4
    after = metrics(setup["x"])
    assert (
        after[("execstate_proxy_decode_seconds_count", ())] == before[("execstate_proxy_decode_seconds_count", ())] + 1
    )


def test_error_shapes_and_failure_stages(setup):
    x = setup["x"]
    m0 = metrics(x)
    assert_openai_error(httpx.post(x + "/v1/completions", content=b"{nope", timeout=10), 400, "invalid_json")
    assert_openai_error(httpx.post(x + "/v1/completions", json=[1, 2], timeout=10), 400, "invalid_request")
    assert_openai_error(httpx.get(x + "/v1/nothing", timeout=10), 404)
    assert_openai_error(httpx.get(x + "/v1/completions", timeout=10), 405)
    # P's own OpenAI error passes through with its status
    setup["p"].reply = JSONResponse({"error": {"message": "bad prompt", "type": "invalid_request_error",
                                               "param": "prompt", "code": None}}, status_code=400)
    err = assert_openai_error(httpx.post(x + "/v1/completions", json={"prompt": "x"}, timeout=10), 400)
    assert err["message"] == "bad prompt" and err["param"] == "prompt"
    # anything else from an instance is wrapped into the shape
    setup["p"].reply = PlainTextResponse("Internal Server Error", status_code=500)
    err = assert_openai_error(httpx.post(x + "/v1/completions", json={"prompt": "x"}, timeout=10), 500, "prefill_error")
    assert "Internal Server Error" in err["message"]
    # a handoff P did not sign with the shared secret never reaches D
    n_d = len(setup["d"].bodies)
    other = SecretRing(b"some-other-secret-0123456789")
    setup["p"].reply = JSONResponse({"kv_transfer_params": HANDOFF.to_params(other)})
    assert_openai_error(httpx.post(x + "/v1/completions", json={"prompt": "x"}, timeout=10), 502, "invalid_handoff")
    setup["p"].reply = JSONResponse({"choices": []})
    assert_openai_error(httpx.post(x + "/v1/completions", json={"prompt": "x"}, timeout=10), 502, "no_handoff")
    assert len(setup["d"].bodies) == n_d
    setup["p"].reply = None
    setup["d"].reply = PlainTextResponse("boom", status_code=503)
    assert_openai_error(httpx.post(x + "/v1/completions", json={"prompt": "x", "stream": True}, timeout=10), 503,
                        "decode_error")
    m1 = metrics(x)
    assert {s: fail_count(m1, s) - fail_count(m0, s) for s in ("request", "prefill", "handoff", "decode")} == \
        {"request": 2, "prefill": 2, "handoff": 2, "decode": 1}


def test_unreachable_prefill_is_502(setup):
    b = setup["broken"]
    err = assert_openai_error(httpx.post(b + "/v1/chat/completions", json={"messages": []}, timeout=10), 502,
                              "prefill_unreachable")
    assert "unreachable" in err["message"] and err["type"] == "server_error"
    m = metrics(b)
    assert fail_count(m, "prefill") == 1
    assert m[("execstate_proxy_requests_total", (("endpoint", "chat"),))] == 1

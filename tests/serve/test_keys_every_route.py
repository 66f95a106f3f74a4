"""On a keyed server every route needs the key but ``/health`` (and ``/metrics`` when the operator
says so), bounds are checked before work, and memory comes back after a burst.

Before: only ``/v1/*`` checked the key. ``/tokenize``, ``/detokenize``, ``/tokenizer_info``,
``/version``, ``/metrics`` answered anyone, and the landing page named the model, its path and
architecture. 16 x 3.9 MB ``/tokenize`` bodies, 8 at once and without a key, cost 145 s of server
CPU and left RSS 1.7 GB up 15 s later, because the length limit was applied after tokenising.

Here, on the test model with the world endpoints and the landing page installed: every HTTP route of
the app and an unknown path answer 401 without a key and something else with it; every WebSocket
route refuses a keyless client; the public pages answer 200 without naming the model; a text that
cannot fit is refused without reaching the tokenizer; a burst of such bodies leaves RSS where it was.
"""

from __future__ import annotations

import concurrent.futures
import re
import time
from pathlib import Path

import httpx
import pytest
from fastapi.routing import APIRoute
from serve_helpers import MODEL_NAME, running_server
from starlette.routing import Mount, WebSocketRoute
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect
from world_serve_helpers import tiny_world_model

from execstate.serve.app import build_app
from execstate.serve.landing import install_landing
from execstate.serve.principals import KeyRing
from execstate.serve.realtime.world.endpoint import install_world
from execstate.serve.realtime.world.host import WorldHost
from execstate.serve.sessions.handover import PEER_PATHS

KEY = "sk-every-route-0001"
AUTH = {"Authorization": f"Bearer {KEY}"}
PUBLIC = {"/health", "/", "/world", "/world.js", "/agent", "/agent.js", "/agent-worklet.js", "/api-key.js"}


def keyed_app(served, public_metrics: bool = False):
    extra = {"public_metrics": True} if public_metrics else {}
    app = build_app(served.engine, MODEL_NAME, keys=KeyRing.build([KEY]), sessions=served.sessions, **extra)
    host = WorldHost(tiny_world_model(), model_name="tiny-world", max_sessions=1)
    install_world(app, host)
    install_landing(app)
    return app, host


@pytest.fixture(scope="module")
def keyed(served):
    app, host = keyed_app(served)
    try:
        with running_server(app) as (url, _):
            yield app, url
    finally:
        host.shutdown()


def http_routes(app) -> list[tuple[str, str]]:
    out = []
    for r in app.routes:
        if isinstance(r, APIRoute):
            path = re.sub(r"\{[^}]+\}", "x", r.path)
            out += [(m, path) for m in sorted(r.methods) if m != "HEAD"]
        elif isinstance(r, Mount):
            out.append(("GET", r.path + "/"))
    return out


def test_every_http_route_but_the_public_ones_needs_the_key(keyed):
    app, url = keyed
    routes = http_routes(app) + [("GET", "/no-such-path"), ("POST", "/v1/no-such-path")]
    assert {p for _, p in routes} >= {"/tokenize", "/detokenize", "/tokenizer_info", "/version", "/metrics",
                                      "/v1/models", "/v1/completions", "/v1/sessions"}
    with httpx.Client(base_url=url, timeout=60) as c:
        for method, path in routes:
            if method == "POST" and path in PEER_PATHS:
                continue  # server-to-server: signed with the instances' secret instead (tests/security/)
            keyless = c.request(method, path, json={})
            if path in PUBLIC:
                assert keyless.status_code == 200, (method, path, keyless.text[:200])
                continue
            assert keyless.status_code == 401, (method, path, keyless.status_code, keyless.text[:200])
            assert keyless.json()["error"]["code"] == "invalid_api_key"
            keyed_answer = c.request(method, path, json={}, headers=AUTH)
            assert keyed_answer.status_code != 401, (method, path)
            if (method, path) == ("POST", "/v1/sessions") and keyed_answer.status_code == 200:
                # the server's sessions are the suite's shared ones: leave none behind
                sid = keyed_answer.json()["session_id"]
                assert c.delete(f"/v1/sessions/{sid}", headers=AUTH).status_code == 200
        assert c.get("/no-such-path", headers=AUTH).status_code == 404


def test_every_websocket_route_refuses_a_keyless_client(keyed):
    app, url = keyed
    paths = [r.path for r in app.routes if isinstance(r, WebSocketRoute)]
    assert set(paths) >= {"/v1/realtime", "/v1/realtime/agent", "/v1/voice/realtime", "/v1/realtime/video"}
    ws = url.replace("http://", "ws://", 1)
    for path in paths:
        with pytest.raises(InvalidStatus) as refused:
            connect(ws + path, open_timeout=10).close()
        assert refused.value.response.status_code == 401, path
        with connect(ws + path, open_timeout=10, subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"]):
            pass  # the browser's way: the key as a subprotocol


def test_public_pages_name_no_model(keyed, served):
    _, url = keyed
    secret = {MODEL_NAME, str(served.engine.model_path), "Qwen3Moe", "tiny-world"}
    for path in PUBLIC:
        r = httpx.get(url + path, timeout=30)
        assert r.status_code == 200, path
        assert not [s for s in secret if s in r.text], (path, [s for s in secret if s in r.text])
    assert "API key" in httpx.get(url + "/", timeout=30).text
    for page in ("/world", "/agent"):
        assert '<script src="/api-key.js">' in httpx.get(url + page, timeout=30).text


def test_metrics_are_public_only_when_the_operator_says_so(served):
    for public, keyless in ((False, 401), (True, 200)):
        app, host = keyed_app(served, public_metrics=public)
        try:
            with running_server(app) as (url, _):
                assert httpx.get(url + "/metrics", timeout=30).status_code == keyless
                assert httpx.get(url + "/metrics", headers=AUTH, timeout=30).status_code == 200
        finally:
            host.shutdown()


class TokenizerSpy:
    """Stands in for the ``tokenizers.Tokenizer`` inside execstate's ``Tokenizer``: records the length
    of every text it is asked to tokenise."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.lengths: list[int] = []

    def encode_batch(self, texts, **kw):
        self.lengths += [len(t) for t in texts]
        return self.inner.encode_batch(texts, **kw)

    def __getattr__(self, name):
        return getattr(self.inner, name)


BIG = "tokens " * (3_900_000 // 7)  # a 3.9 MB prompt: far more than the model's context can hold


@pytest.mark.parametrize(("path", "body"), [
    ("/tokenize", {"prompt": BIG}),
    ("/tokenize", {"prompt": BIG, "add_special_tokens": False}),
    ("/tokenize", {"messages": [{"role": "user", "content": BIG}]}),
    ("/v1/completions", {"model": MODEL_NAME, "prompt": BIG, "max_tokens": 1}),
    ("/v1/chat/completions", {"model": MODEL_NAME, "messages": [{"role": "user", "content": BIG}], "max_tokens": 1}),
])
def test_a_text_that_cannot_fit_never_reaches_the_tokenizer(keyed, served, monkeypatch, path, body):
    _, url = keyed
    tok = served.engine.tokenizer
    spy = TokenizerSpy(tok._tok)
    monkeypatch.setattr(tok, "_tok", spy)
    r = httpx.post(url + path, json=body, headers=AUTH, timeout=120)
    assert r.status_code == 400 and "too long" in r.json()["error"]["message"], r.text[:300]
    assert max(spy.lengths, default=0) < len(BIG) // 2, spy.lengths  # the big text never reached it


def rss_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20


def test_memory_comes_back_after_a_burst(keyed):
    """16 bodies of 3.9 MB, 8 at once, with the key (the server reads and parses each): 15 s later
    the RSS of the process serving them is within 100 MB of where it was."""
    _, url = keyed
    body = {"prompt": BIG}

    def one(_: int) -> int:
        return httpx.post(url + "/tokenize", json=body, headers=AUTH, timeout=300).status_code

    one(0)  # warm-up: the first big body sizes the allocator's arenas
    time.sleep(1)
    before = rss_mb()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert set(pool.map(one, range(16))) == {400}
    deadline = time.monotonic() + 15
    while rss_mb() - before > 100 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert rss_mb() - before <= 100, f"RSS {before:.0f} -> {rss_mb():.0f} MB 15 s after the burst"
    assert httpx.get(url + "/health", timeout=2).status_code == 200

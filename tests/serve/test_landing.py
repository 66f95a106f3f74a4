"""The landing page at ``/`` and ``execstate serve`` with no model.

The page lists what the app serves: built on a real app (the test model; the world app), it names
the served model, each surface's endpoint, the world page only where a world model is served, and
links the docs site when one is built. ``execstate serve`` with no MODEL serves the embedded
default with every endpoint (a parse-level test here; the whole server in a slow test).
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from serve_helpers import MODEL_NAME, free_port
from world_serve_helpers import tiny_world_model

from execstate import cli
from execstate.serve.landing import install_landing
from execstate.serve.realtime.world.app import build_world_app
from execstate.serve.realtime.world.endpoint import install_world
from execstate.serve.realtime.world.host import WorldHost


def _landing(app: FastAPI, docs_dir: Path | None = None) -> str:
    install_landing(app, docs_dir)
    r = TestClient(app).get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    return r.text


def test_lm_server_page_lists_its_model_and_surfaces(served, tmp_path) -> None:
    app = FastAPI()
    app.state.__dict__.update(served.app.state.__dict__)  # the served app's surfaces, on a fresh app
    page = _landing(app)
    assert MODEL_NAME in page and "Qwen3MoeForCausalLM" in page
    for path in ("/v1/chat/completions", "WS /v1/realtime", "WS /v1/realtime/agent", "/v1/sessions", "/tokenize",
                 "WS /v1/voice/realtime", '<a href="/agent">',
                 '<a href="/metrics">'):
        assert path in page, path
    assert "routes returned (R3)</th><td>with every completion" in page
    assert '<a href="/world">' not in page and "/v1/realtime/video" not in page  # no world model here
    assert "make docs" in page  # no docs site given: how to build it


def test_world_server_page_and_docs_site(tmp_path) -> None:
    host = WorldHost(tiny_world_model(), model_name="tiny-world", max_sessions=1)
    try:
        site = tmp_path / "site"
        site.mkdir()
        (site / "index.html").write_text("<h1>docs home</h1>")
        app = FastAPI()
        install_world(app, host)
        page = _landing(app, site)
        assert '<a href="/world">/world</a>' in page and "WS /v1/realtime/video" in page
        assert "tiny-world" in page and "/v1/chat/completions" not in page  # world-only
        assert '<a href="/docs/">The documentation</a>' in page
        assert TestClient(app).get("/docs/").text == "<h1>docs home</h1>"
        world_only = TestClient(build_world_app(host))  # `serve --world`: the page is there too
        assert "tiny-world" in world_only.get("/").text
    finally:
        host.shutdown()


@pytest.fixture
def cli_logging_restored():
    """``cli.main`` adds a handler bound to this test's stderr to the ``execstate`` logger; it goes
    afterwards, so a later test's own CLI logging is not written to a closed capture."""
    logger = logging.getLogger("execstate")
    before = list(logger.handlers), logger.level
    yield
    logger.handlers[:], logger.level = before


def test_serve_without_a_model_serves_the_default_with_every_endpoint(monkeypatch, capsys,
                                                                      cli_logging_restored) -> None:
    seen: list[argparse.Namespace] = []
    monkeypatch.setattr("execstate.serve.server.run_server", lambda args: seen.append(args) or 0)
    assert cli.main(["serve", "--port", "8123"]) == 0
    assert seen[0].model == cli.DEFAULT_SERVE_MODEL == "smollm2-moe" and seen[0].world == "world,maze"
    # routes recorded, returned to the requests that ask (not a blob on every chat answer)
    assert seen[0].routed_experts_on_request is True and seen[0].enable_return_routed_experts is False
    assert "every endpoint" in capsys.readouterr().err
    seen.clear()
    assert cli.main(["serve", "--enable-return-routed-experts"]) == 0  # vLLM's flag: routes with every answer
    assert seen[0].enable_return_routed_experts is True and seen[0].routed_experts_on_request is False
    seen.clear()
    assert cli.main(["serve", "some-model"]) == 0  # a MODEL alone: as before, no world
    assert seen[0].model == "some-model" and seen[0].world is None and not seen[0].enable_return_routed_experts
    assert not seen[0].routed_experts_on_request
    capsys.readouterr()
    assert cli.main(["serve", "some-model", "--ray", "--routed-experts-on-request"]) == 2  # a single-server option
    assert "--routed-experts-on-request: a single-server option" in capsys.readouterr().err and len(seen) == 1


@pytest.mark.slow
def test_serve_default_end_to_end(tmp_path) -> None:
    """The real default: smollm2-moe (built on first use) and the shipped world model."""
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "execstate", "serve", "--port", str(port)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 600
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        page = httpx.get(url + "/", timeout=10).text
        assert "smollm2-moe" in page and '<a href="/world">' in page and "WS /v1/realtime/agent" in page
        assert 'routes returned (R3)</th><td>to requests with &quot;return_routed_experts&quot;: true' in page
        assert httpx.get(url + "/world", timeout=10).status_code == 200
        body = {"model": "smollm2-moe", "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
        r = httpx.post(url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200 and "Paris" in r.json()["choices"][0]["text"]
        assert "routed_experts" not in r.json()["choices"][0]
        r = httpx.post(url + "/v1/completions", json={**body, "return_routed_experts": True}, timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["routed_experts"]
    finally:
        proc.terminate()
        proc.wait(30)

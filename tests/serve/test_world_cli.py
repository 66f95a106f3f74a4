"""``execstate serve --world``: the options, a world-only server in a subprocess (the page, the
script, /health, a session over the socket), and the LM server's arguments unchanged."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time

import httpx
import pytest
from serve_helpers import free_port
from websockets.asyncio.client import connect
from world_serve_helpers import WorldClient, tiny_world_model, ws_url

from execstate.cli import build_parser
from execstate.model.world.weights import save_weights


def test_serve_options():
    p = build_parser()
    a = p.parse_args(["serve", "--world"])
    assert (a.model, a.world, a.world_max_sessions, a.world_session_memory, a.world_fps) == (
        None, "world,maze", 8, 8 << 20, 16.0)
    a = p.parse_args(["serve", "some-lm", "--world", "/m", "--world-session-memory", "2MiB", "--world-fps", "0"])
    assert (a.model, a.world, a.world_session_memory, a.world_fps) == ("some-lm", "/m", 2 << 20, 0.0)
    a = p.parse_args(["serve", "some-lm"])
    assert (a.model, a.world) == ("some-lm", None)  # the LM server as before
    assert p.parse_args(["serve", "--world", "--world-max-frames", "7"]).world_max_frames == 7
    for fps in ("0.5", "241", "5e-324", "nan", "-1"):  # 0, or 1 to 240
        with pytest.raises(SystemExit):
            p.parse_args(["serve", "--world", "--world-fps", fps])
    # `serve` with neither: the embedded default with every endpoint (tests/serve/test_landing.py
    # runs it with run_server replaced; calling a.func here would start a real server that never returns)
    assert (p.parse_args(["serve"]).model, p.parse_args(["serve"]).world) == (None, None)


def test_world_only_server_subprocess(tmp_path):
    model_dir = tmp_path / "tiny-world"
    save_weights(tiny_world_model().net, model_dir)
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    proc = subprocess.Popen([sys.executable, "-m", "execstate", "serve", "--world", str(model_dir), "--port",
                             str(port), "--world-max-sessions", "2", "--world-threads", "1"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()[-2000:]
            try:
                if httpx.get(f"{url}/health", timeout=2).json()["status"] == "ok":
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)
        assert httpx.get(f"{url}/health").json() == {"status": "ok"}  # the LM server's shape
        page = httpx.get(f"{url}/world")
        assert page.status_code == 200 and '<canvas id="screen"' in page.text and "/world.js" in page.text
        script = httpx.get(f"{url}/world.js")
        assert script.headers["content-type"].startswith("text/javascript") and "/v1/realtime/video" in script.text
        assert httpx.get(f"{url}/v1/models").status_code == 404  # no LM here

        async def session():
            async with connect(ws_url(url)) as ws:
                c = WorldClient(ws)
                start = await c.ask({"type": "session.create", "fps": 0, "num_frames": 4, "event_id": 1})
                assert start["type"] == "video.start" and start["config"]["model"] == str(model_dir)
                done = await c.until("session.closed")
                assert done["frames"] == 4 and len(c.chunks) == 2

        asyncio.run(session())
    finally:
        proc.terminate()
        proc.wait(30)
    with proc.stdout:
        out = proc.stdout.read().decode()
    block = out[out.index("execstate serve --world ready"):]  # the start-up block, like the LM server's
    for label, value in (("world model", f"{model_dir}"), ("world sessions", "at most 2,"), ("default fps", "16"),
                         ("listening on", f"http://127.0.0.1:{port}"), ("API key", "off"), ("start-up", "")):
        assert re.search(rf"^  {label} +{re.escape(value)}", block, re.M), (label, block)


def test_lm_app_with_world_endpoints(served):
    """``serve MODEL --world``: the LM app keeps its endpoints and gains the world ones."""
    from fastapi.testclient import TestClient
    from serve_helpers import MODEL_NAME

    from execstate.serve.app import build_app
    from execstate.serve.realtime.world.endpoint import install_world
    from execstate.serve.realtime.world.host import WorldHost

    app = build_app(served.engine, MODEL_NAME, sessions=served.sessions)
    host = WorldHost(tiny_world_model(), max_sessions=1)
    install_world(app, host)
    try:
        with TestClient(app) as client:
            assert client.get("/v1/models").json()["data"][0]["id"] == MODEL_NAME
            out = client.post("/v1/completions", json={"model": MODEL_NAME, "prompt": [1, 2, 3], "max_tokens": 2})
            assert out.status_code == 200 and len(out.json()["choices"]) == 1
            assert '<canvas id="screen"' in client.get("/world").text
            with client.websocket_connect("/v1/realtime/video") as ws:
                ws.send_json({"type": "session.create", "fps": 0, "num_frames": 2, "format": "rgb"})
                assert ws.receive_json()["type"] == "video.start"
                meta = ws.receive_json()
                assert meta["type"] == "video.chunk_metadata" and len(ws.receive_bytes()) == meta["byte_length"]
                assert ws.receive_json()["type"] == "session.closed"
    finally:
        host.shutdown()

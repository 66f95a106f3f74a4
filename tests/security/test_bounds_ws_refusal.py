"""Finding 7: every refused WebSocket upgrade (a client without the API key) logged
uvicorn's ``ERROR: ASGI callable returned without completing handshake.``, as if the server had
failed. Now the refusal is an HTTP 401 with the OpenAI error body and one INFO line saying why
(``execstate.serve.ws_refusal``); nothing is logged as an error, and a connection that does end
without a handshake for another reason is still logged."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI, WebSocket
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serve"))
from serve_helpers import free_port  # noqa: E402

from execstate.serve.auth import APIKeyMiddleware  # noqa: E402

KEY = "sekrit-key"


def _serve(app: FastAPI):
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_config=None, log_level="info"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive()
        time.sleep(0.02)
    return server, thread


@pytest.fixture(scope="module")
def keyed():
    app = FastAPI()
    app.add_middleware(APIKeyMiddleware, api_key=KEY)

    @app.websocket("/v1/realtime")
    async def accept(ws: WebSocket) -> None:
        await ws.accept()
        await ws.close()

    server, thread = _serve(app)
    yield f"ws://127.0.0.1:{server.config.port}"
    server.should_exit = True
    thread.join(10)


def _refused(url: str, **kw) -> int:
    async def run() -> int:
        try:
            async with connect(url, **kw):
                return 101
        except InvalidStatus as e:
            assert b"invalid_api_key" in e.response.body
            return e.response.status_code

    return asyncio.run(run())


def test_refused_upgrade_is_one_info_line_not_an_error(keyed, caplog):
    caplog.set_level(logging.INFO)
    for kw in ({}, {"additional_headers": {"Authorization": "Bearer wrong"}},
               {"subprotocols": ["realtime", "openai-insecure-api-key.wrong"]}):
        assert _refused(f"{keyed}/v1/realtime", **kw) == 401
    time.sleep(0.2)  # uvicorn logs after the app returned
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []
    refusals = [r for r in caplog.records if r.name == "execstate.serve.ws_refusal"]
    assert len(refusals) == 3 and all(r.levelno == logging.INFO for r in refusals)
    assert all("/v1/realtime" in r.getMessage() and "invalid API key" in r.getMessage() and "(401)" in r.getMessage()
               for r in refusals)
    ok = asyncio.run(_accepted(f"{keyed}/v1/realtime"))
    assert ok


async def _accepted(url: str) -> bool:
    async with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        return ws.protocol.state.name in ("OPEN", "CLOSING", "CLOSED")


def test_the_filter_drops_only_the_refused_connections_record():
    """Any other connection that ends without a handshake is still logged as an error."""
    from execstate.serve.ws_refusal import _FILTER, UVICORN_NO_HANDSHAKE, _refused

    record = logging.LogRecord("uvicorn.error", logging.ERROR, __file__, 1, UVICORN_NO_HANDSHAKE, None, None)
    assert _FILTER.filter(record)  # not marked: kept
    token = _refused.set(True)
    try:
        assert not _FILTER.filter(record)  # the refusal's own task: dropped
        other = logging.LogRecord("uvicorn.error", logging.ERROR, __file__, 1, "Exception in ASGI application", None,
                                  None)
        assert _FILTER.filter(other)
    finally:
        _refused.reset(token)

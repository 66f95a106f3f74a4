"""Helpers for the security tests: a real server (uvicorn in a thread over an ``AsyncEngine`` of the
tiny random MoE), a synchronous realtime client, HTTP calls with a key, and a recording proxy.

``app_with(**kw)`` builds the app with only the keyword arguments ``build_app`` takes: the tests
of the issue-19 findings configure what the fix added (keys of two tenants, an idle TTL,
migration targets) and must also *run* against the code before the fix, where they then fail on
the finding itself, not on an unknown argument (how each was checked: docs/security.md).
"""

from __future__ import annotations

import inspect
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from websockets.sync.client import ClientConnection, connect

from execstate.engine.async_engine import AsyncEngine
from execstate.engine.config import EngineConfig
from execstate.engine.llm_engine import LLMEngine
from execstate.serve.app import build_app

RECV_TIMEOUT_S = 60.0
KEY_A, KEY_B = "tenant-a-key-0001", "tenant-b-key-0002"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def app_with(engine: AsyncEngine, name: str = "m", **kw: Any) -> Any:
    """``build_app(engine, name, **kw)``, leaving out what this version's ``build_app`` does not take."""
    known = inspect.signature(build_app).parameters
    return build_app(engine, name, **{k: v for k, v in kw.items() if k in known})


def keys_of(path: Any, **tenants: str) -> Any:
    """A ``KeyRing`` of ``key -> tenant`` (None where this version has no key ring)."""
    try:
        from execstate.serve.principals import KeyRing
    except ImportError:
        return None
    path.write_text("".join(f"{key} {tenant}\n" for tenant, key in tenants.items()))
    return KeyRing.build([], path)


@contextmanager
def serving(app: Any, port: int | None = None) -> Iterator[str]:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port or free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(10)


@dataclass
class Served:
    engine: AsyncEngine
    app: Any
    url: str


@contextmanager
def server(model_dir: Any, engine_kw: dict[str, Any] | None = None, pd: Any = None, port: int | None = None,
           **app_kw: Any) -> Iterator[Served]:
    """A real server on its own engine; ``pd`` (a ``PDConfig``): the engine's PD connector."""
    cfg = EngineConfig(model=str(model_dir), seed=0, enable_return_routed_experts=True, kv_transfer=pd,
                       **(engine_kw or {}))
    engine = AsyncEngine(LLMEngine(cfg))
    try:
        app = app_with(engine, **app_kw)
        with serving(app, port) as url:
            yield Served(engine, app, url)
    finally:
        if pd is not None:
            engine.call(lambda e: e.pd.close() if e.pd is not None else None)
        engine.shutdown()


def http(method: str, url: str, key: str | None = None, body: Any = None, headers: dict[str, str] | None = None,
         **kw: Any) -> httpx.Response:
    headers = dict(headers or {}, **({"authorization": f"Bearer {key}"} if key else {}))
    return httpx.request(method, url, json=body, headers=headers, timeout=120, **kw)


def code_of(r: httpx.Response) -> str | None:
    try:
        return r.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None


class WS:
    """A synchronous realtime client: ``ask`` sends and returns the next event."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws

    def send(self, msg: dict[str, Any]) -> None:
        self.ws.send(json.dumps(msg))

    def recv(self, timeout: float = RECV_TIMEOUT_S) -> dict[str, Any]:
        return json.loads(self.ws.recv(timeout))

    def ask(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.send(msg)
        return self.recv()

    def respond(self, **fields: Any) -> dict[str, Any]:
        """``response.create``: its ``response.done`` (or the error refusing it)."""
        first = self.ask({"type": "response.create", **fields})
        if first["type"] != "response.created":
            return first
        while (event := self.recv())["type"] != "response.done":
            pass
        return event

    def close(self) -> None:
        self.ws.close()


@contextmanager
def ws(http_url: str, key: str | None = None, path: str = "/v1/realtime") -> Iterator[WS]:
    headers = {"Authorization": f"Bearer {key}"} if key else None
    with connect(http_url.replace("http://", "ws://", 1) + path, additional_headers=headers, max_size=None,
                 open_timeout=30) as conn:
        yield WS(conn)


def wait_until(pred: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what or pred}"
        time.sleep(0.02)


class Recorder:
    """An HTTP endpoint that records every request (method, path, headers, body) and, when
    ``upstream`` is set, forwards it there. ``answer(path)`` can replace the upstream's answer
    (a status code: the request is still forwarded; ``None``: forwarded unchanged), and
    ``after_forward(path)`` runs once a request to ``path`` was forwarded (e.g. to kill the upstream)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        self.upstream: str | None = None
        self.status_for: dict[str, int] = {}
        self.drop: set[str] = set()  # not forwarded, answered 502
        self.after_forward: dict[str, Callable[[], None]] = {}
        self.app = Starlette(routes=[Route("/{path:path}", self._handle, methods=["GET", "POST", "DELETE"])])

    async def _handle(self, request: Request) -> Response:
        body = await request.body()
        path = "/" + request.path_params["path"]
        self.requests.append((request.method, path, dict(request.headers), body))
        if self.upstream is None or path in self.drop:
            return Response(b'{"error": {"code": "refused", "message": "dropped"}}', 502,
                            media_type="application/json")
        try:
            async with httpx.AsyncClient(timeout=120) as client:
                headers = {k: v for k, v in request.headers.items() if k not in ("host", "content-length")}
                resp = await client.request(request.method, self.upstream + path, content=body, headers=headers)
        except httpx.HTTPError as e:  # the upstream is down: what a proxy answers then
            return Response(f'{{"error": {{"code": "unreachable", "message": "{type(e).__name__}"}}}}'.encode(), 502,
                            media_type="application/json")
        hook = self.after_forward.pop(path, None)
        if hook is not None:
            hook()
        status = self.status_for.get(path)
        if status is not None:
            return Response(b'{"error": {"code": "refused", "message": "injected"}}', status,
                            media_type="application/json")
        return Response(resp.content, resp.status_code, media_type=resp.headers.get("content-type"))

    def bodies(self, path: str) -> list[bytes]:
        return [body for _, p, _, body in self.requests if p == path]


def start_process(args: list[str], port: int, secret: str | None = None) -> Any:
    """``execstate ARGS --port PORT`` as its own process (``EXECSTATE_KV_SECRET``: ``secret``)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env.pop("EXECSTATE_KV_SECRET", None)
    if secret is not None:
        env["EXECSTATE_KV_SECRET"] = secret
    import tempfile

    log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the process; not a pipe: never blocks it
    proc = subprocess.Popen([sys.executable, "-m", "execstate", *args, "--port", str(port)],
                            cwd=Path(__file__).resolve().parents[2], env=env, stdout=subprocess.DEVNULL, stderr=log)
    proc.log = log
    return proc


def process_log(proc: Any) -> str:
    proc.log.seek(0)
    return proc.log.read().decode(errors="replace")


def wait_healthy(proc: Any, url: str, timeout: float = 300.0) -> None:
    def healthy() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited: {process_log(proc)[-2000:]}")
        try:
            return httpx.get(url + "/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(healthy, timeout, f"{url} to become healthy")


def stop_process(proc: Any) -> None:
    import signal
    import subprocess

    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()

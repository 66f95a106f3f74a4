"""A small client for the realtime WebSocket tests (the ``websockets`` library against a real
uvicorn), the leak check every test ends with, and a slow-step switch for mid-stream tests."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import numpy as np
from websockets.asyncio.client import ClientConnection, connect

from execstate.engine.async_engine import AsyncEngine
from execstate.engine.llm_engine import LLMEngine
from execstate.engine.step_failure import check_references
from execstate.session.lm.async_sessions import AsyncSessions

RECV_TIMEOUT_S = 60.0  # a loaded 2-core machine; an answer normally comes in milliseconds


def ws_url(http_url: str) -> str:
    return http_url.replace("http://", "ws://", 1) + "/v1/realtime"


class Client:
    """Sends messages, reads server events; ``log`` keeps the whole exchange (for transcripts)."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.log: list[tuple[str, Any]] = []

    async def send(self, msg: dict[str, Any] | str | bytes) -> None:
        self.log.append((">", msg))
        await self.ws.send(json.dumps(msg) if isinstance(msg, dict) else msg)

    async def recv(self, timeout: float = RECV_TIMEOUT_S) -> dict[str, Any]:
        event = json.loads(await asyncio.wait_for(self.ws.recv(), timeout))
        self.log.append(("<", event))
        return event

    async def ask(self, msg: dict[str, Any] | str | bytes) -> dict[str, Any]:
        """Send and return the next event (its answer, when nothing else is in flight)."""
        await self.send(msg)
        return await self.recv()

    async def until_done(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Events up to and including the next ``response.done``: (deltas and others, done)."""
        before = []
        while (event := await self.recv())["type"] != "response.done":
            before.append(event)
        return before, event

    async def respond(self, **fields: Any) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
        """``response.create``: (response.created, deltas, response.done)."""
        created = await self.ask({"type": "response.create", **fields})
        assert created["type"] == "response.created", created
        deltas, done = await self.until_done()
        assert all(d["type"] == "response.delta" for d in deltas), deltas
        return created, deltas, done


@asynccontextmanager
async def client(http_url: str, **kw: Any) -> AsyncIterator[Client]:
    async with connect(ws_url(http_url), max_size=None, **kw) as ws:
        yield Client(ws)


async def open_session(c: Client, **session: Any) -> dict[str, Any]:
    event = await c.ask({"type": "session.create", "event_id": "open", "session": session})
    assert event["type"] == "session.created", event
    return event["session"]


def decode_routes(b64: str) -> np.ndarray:
    return np.load(io.BytesIO(base64.b64decode(b64)), allow_pickle=False)


def wait_released(owner: AsyncSessions, sessions: int = 0, timeout: float = 30.0) -> tuple[int, int, int, int]:
    """Poll until no request runs or waits, nothing is held and ``sessions`` are resident in
    ``owner`` (the app's ``AsyncSessions``); then check the pools. Returns (running, waiting, blocks
    used, holders) as last seen."""
    engine = owner.engine

    def state(e: LLMEngine) -> tuple[int, int, int, int]:
        return (len(e.scheduler.running), len(e.scheduler.waiting), e.block_pool.num_used, e.kv_holds.num_holders)

    deadline = time.monotonic() + timeout
    while True:
        s = (*engine.call(state), owner.call(lambda lm: lm.manager.num_resident))
        if (s[0], s[1], s[4]) == (0, 0, sessions) and (sessions or s[2:4] == (0, 0)):
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"not released: running, waiting, blocks used, holders, sessions = {s}")
        time.sleep(0.02)

    def check(e: LLMEngine) -> None:
        e.check_integrity()
        check_references(e)

    engine.call(check)
    return s[:4]


@contextmanager
def slow_steps(engine: AsyncEngine, seconds: float = 0.005):
    """Each engine step takes >= ``seconds``, so a long step is still streaming when the client acts."""

    def install(e: LLMEngine) -> None:
        real = e.step

        def step():
            time.sleep(seconds)
            return real()

        e.step = step

    engine.call(install)
    try:
        yield
    finally:
        engine.call(lambda e: e.__dict__.pop("step"))


@contextmanager
def fail_session_step(engine: AsyncEngine, session_id: str):
    """The first engine step that runs a step of ``session_id`` raises (a fault injected on the
    engine thread): that step fails, the engine and other requests go on."""

    def install(e: LLMEngine) -> None:
        real = e.runner.execute
        fired: list[bool] = []

        def execute(sched):
            if not fired and any(s.request.request_id.startswith(f"session:{session_id}:") for s in sched.scheduled):
                fired.append(True)
                raise RuntimeError("injected step fault")
            return real(sched)

        e.runner.execute = execute

    engine.call(install)
    try:
        yield
    finally:
        engine.call(lambda e: e.runner.__dict__.pop("execute"))

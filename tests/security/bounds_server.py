"""The server the bounds tests (findings 6 and 7) attack: one real uvicorn serving a tiny
random MoE LM (with a chat template) with its three WebSockets (``/v1/realtime``,
``/v1/realtime/agent``, ``/v1/realtime/video`` with a tiny random world model) and the HTTP API,
logging to the root logger (``log_config=None``) so that ``caplog`` sees uvicorn's records.

Import the fixture into a test module (``from bounds_server import bounds_served  # noqa: F401``).
Only names that existed before the fixes are imported here, so these tests run (and fail) against
the code before them too.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from websockets.asyncio.client import ClientConnection, connect

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serve"))

from serve_helpers import MODEL_NAME, engine_config, free_port, write_tokenizer  # noqa: E402
from world_serve_helpers import tiny_world_model  # noqa: E402

from execstate.engine.async_engine import AsyncEngine  # noqa: E402
from execstate.engine.llm_engine import LLMEngine  # noqa: E402
from execstate.model.random_models import make_random  # noqa: E402
from execstate.serve.app import build_app  # noqa: E402
from execstate.serve.realtime.world.endpoint import install_world  # noqa: E402
from execstate.serve.realtime.world.host import WorldHost  # noqa: E402

RECV_TIMEOUT_S = 60.0
PATHS = {"lm": "/v1/realtime", "agent": "/v1/realtime/agent", "world": "/v1/realtime/video"}
# The message that opens a session on each socket (each answered by a success event)
OPEN = {
    "lm": ({"type": "session.create", "session": {}}, "session.created"),
    "agent": ({"type": "session.create", "session": {"turn": {"end_of_turn_silence_s": 0.05}}}, "session.created"),
    "world": ({"type": "session.create", "fps": 0, "num_frames": 2}, "video.start"),
}


@dataclass
class Served:
    url: str
    app: Any
    engine: AsyncEngine
    world: WorldHost

    def ws(self, kind: str) -> str:
        return self.url.replace("http://", "ws://", 1) + PATHS[kind]


@pytest.fixture(scope="module")
def bounds_served(tmp_path_factory) -> Iterator[Served]:
    model_dir = make_random("qwen3_moe", tmp_path_factory.mktemp("bounds_moe"), seed=0)
    write_tokenizer(model_dir)
    engine = AsyncEngine(LLMEngine(engine_config(model_dir)))
    app = build_app(engine, MODEL_NAME)
    world = WorldHost(tiny_world_model(), max_sessions=4)
    install_world(app, world)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_config=None,
                                           log_level="info"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    yield Served(f"http://127.0.0.1:{server.config.port}", app, engine, world)
    server.should_exit = True
    thread.join(10)
    engine.shutdown()
    world.shutdown()


class Raw:
    """A WebSocket client that sends frames as given and reads JSON events (binary frames skipped)."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws

    async def send(self, frame: str | dict[str, Any]) -> None:
        await self.ws.send(frame if isinstance(frame, str) else json.dumps(frame))

    async def recv(self, timeout: float = RECV_TIMEOUT_S) -> dict[str, Any]:
        while True:
            frame = await asyncio.wait_for(self.ws.recv(), timeout)
            if isinstance(frame, str):
                return json.loads(frame)

    async def until(self, pred: Any, timeout: float = RECV_TIMEOUT_S) -> dict[str, Any]:
        async def find() -> dict[str, Any]:
            while not pred(event := await self.recv()):
                pass
            return event

        return await asyncio.wait_for(find(), timeout)

    async def ask(self, frame: str | dict[str, Any], answer: str | None = None) -> dict[str, Any]:
        await self.send(frame)
        if answer is None:
            return await self.recv()
        return await self.until(lambda e: e["type"] in (answer, "error"))


def connect_raw(served: Served, kind: str) -> Any:
    return connect(served.ws(kind), max_size=None)


def error_code(event: dict[str, Any]) -> str | None:
    """An ``error`` event's code in either wire shape (OpenAI's nested, vLLM-Omni's flat)."""
    if event.get("type") != "error":
        return None
    return event["error"]["code"] if isinstance(event.get("error"), dict) else event.get("code")


def health_ok(url: str) -> bool:
    return httpx.get(f"{url}/health", timeout=10).status_code == 200


_PROBE = """
import json, sys, threading, time
import httpx
url, gap = sys.argv[1], float(sys.argv[2])
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
out = []
with httpx.Client(base_url=url, timeout=120) as c:
    c.get("/health")
    print("ready", flush=True)
    while not stop.is_set():
        t0 = time.perf_counter()
        status = c.get("/health").status_code
        out.append([time.time(), time.perf_counter() - t0, status])
        time.sleep(gap)
print(json.dumps(out), flush=True)
"""


class Prober:
    """Probes ``/health`` back to back (``gap`` s apart) from a separate process, so that its clock
    keeps running while the server's process is stalled (a server in a thread of the test process
    that holds the GIL would stall an in-process prober too, hiding the stall). ``samples``:
    (wall time, latency s, status) of each probe; ``window(t0, t1)`` the latencies of the probes
    that started within it."""

    def __init__(self, url: str, gap: float = 0.01) -> None:
        self.url, self.gap = url, gap
        self.samples: list[tuple[float, float, int]] = []

    def __enter__(self) -> Prober:
        self._proc = subprocess.Popen([sys.executable, "-c", _PROBE, self.url, str(self.gap)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True)
        assert self._proc.stdout is not None and self._proc.stdout.readline().strip() == "ready"
        return self

    def __exit__(self, *exc: object) -> None:
        out, _ = self._proc.communicate(timeout=300)
        self.samples = [tuple(x) for x in json.loads(out.strip().splitlines()[-1])]

    def window(self, t0: float, t1: float) -> list[float]:
        return [lat for start, lat, _ in self.samples if t0 <= start <= t1]

    @property
    def latencies(self) -> list[float]:
        return [lat for _, lat, _ in self.samples]

    @property
    def worst(self) -> float:
        return max(self.latencies)

    @property
    def statuses(self) -> set[int]:
        return {status for _, _, status in self.samples}

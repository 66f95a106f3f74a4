"""Helpers for the serving tests: the tiny tokenizer for the random model (from
``execstate.model.random_tokenizer``), engine configs, ports, and polling the engine
until it is idle."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn

from execstate.engine.async_engine import AsyncEngine
from execstate.engine.config import EngineConfig
from execstate.model.random_tokenizer import CHAT_TEMPLATE, VOCAB, write_tokenizer

__all__ = ["CHAT_TEMPLATE", "MODEL_NAME", "VOCAB", "engine_config", "free_port", "wait_idle", "write_tokenizer"]

MODEL_NAME = "tiny-moe"


def engine_config(model_dir: Path, **kw) -> EngineConfig:
    kw.setdefault("enable_return_routed_experts", True)
    return EngineConfig(model=str(model_dir), seed=0, **kw)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]




def wait_idle(engine: AsyncEngine, timeout: float = 10.0) -> tuple[int, int, int]:
    """Poll until no request runs or waits; returns (running, waiting, blocks used)."""
    deadline = time.monotonic() + timeout
    while True:
        state = engine.call(lambda e: (len(e.scheduler.running), len(e.scheduler.waiting), e.block_pool.num_used))
        if state == (0, 0, 0) or time.monotonic() > deadline:
            return state
        time.sleep(0.02)


@contextmanager
def running_server(app, port: int | None = None) -> Iterator[tuple[str, uvicorn.Server]]:
    """Serve ``app`` with a real uvicorn on 127.0.0.1 (``port``, else a free one) in a thread;
    yields (base url, server). A free port can be taken between its probe and uvicorn's bind (an
    outgoing connection, another test's server: "address already in use" in a suite run): then
    another one is tried, up to 3."""
    for attempt in range(1 if port else 3):
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port or free_port(), log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 20
        while not server.started and thread.is_alive():
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        if server.started:
            break
        assert port is None and attempt < 2, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{server.config.port}", server
    finally:
        server.should_exit = True
        thread.join(10)

"""Fixtures: a tiny random Qwen3-MoE with a tiny byte-level BPE tokenizer and a chat
template, an ``AsyncEngine`` serving it (route return on) behind a real uvicorn on
127.0.0.1, and an offline ``LLM`` on the same weights as the reference."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvicorn
from serve_helpers import MODEL_NAME, engine_config, free_port, write_tokenizer

from execstate import LLM
from execstate.engine.async_engine import AsyncEngine
from execstate.engine.llm_engine import LLMEngine
from execstate.model.random_models import make_random
from execstate.serve.app import build_app
from execstate.session.lm.async_sessions import AsyncSessions


@dataclass
class Served:
    engine: AsyncEngine
    url: str  # http://127.0.0.1:PORT
    app: object

    @property
    def sessions(self) -> AsyncSessions:
        """The app's LM sessions (the engine's one ``AsyncSessions``)."""
        return self.app.state.ctx.sessions  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    d = make_random("qwen3_moe", tmp_path_factory.mktemp("serve_moe"), seed=0)
    write_tokenizer(d)
    return d


@pytest.fixture(scope="session")
def offline(model_dir) -> LLM:
    return LLM(str(model_dir), enable_return_routed_experts=True, seed=0)


@pytest.fixture(scope="session")
def served(model_dir) -> Iterator[Served]:
    engine = AsyncEngine(LLMEngine(engine_config(model_dir)))
    app = build_app(engine, MODEL_NAME)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    yield Served(engine, f"http://127.0.0.1:{port}", app)
    server.should_exit = True
    thread.join(10)
    engine.shutdown()

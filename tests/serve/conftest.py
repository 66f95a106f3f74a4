"""Fixtures: a tiny random Qwen3-MoE with a tiny byte-level BPE tokenizer and a chat
template, an ``AsyncEngine`` serving it (route return on) behind a real uvicorn on
127.0.0.1, and an offline ``LLM`` on the same weights as the reference."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvicorn
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from execstate import LLM
from execstate.engine.async_engine import AsyncEngine
from execstate.engine.config import EngineConfig
from execstate.engine.llm_engine import LLMEngine
from execstate.model.random_models import make_random
from execstate.serve.app import build_app

MODEL_NAME = "tiny-moe"
VOCAB = 512
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def write_tokenizer(model_dir: Path) -> None:
    """Byte-level BPE over exactly VOCAB ids: 3 specials, 256 bytes, letter-pair merges."""
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    letters = "etaoinsrhldcumfpgwybvkxjqz"
    merges = []
    for a, b in [("Ġ", x) for x in letters] + [(x, y) for x in letters for y in letters]:
        if len(vocab) == VOCAB:
            break
        vocab[a + b] = len(vocab)
        merges.append((a, b))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<pad>", "<s>", "</s>"])
    tok.save(str(model_dir / "tokenizer.json"))
    cfg = {"bos_token": "<s>", "eos_token": "</s>", "chat_template": CHAT_TEMPLATE}
    (model_dir / "tokenizer_config.json").write_text(json.dumps(cfg))


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    d = make_random("qwen3_moe", tmp_path_factory.mktemp("serve_moe"), seed=0)
    write_tokenizer(d)
    return d


def engine_config(model_dir: Path, **kw) -> EngineConfig:
    kw.setdefault("enable_return_routed_experts", True)
    return EngineConfig(model=str(model_dir), seed=0, **kw)


@pytest.fixture(scope="session")
def offline(model_dir) -> LLM:
    return LLM(str(model_dir), enable_return_routed_experts=True, seed=0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Served:
    engine: AsyncEngine
    url: str  # http://127.0.0.1:PORT
    app: object


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


def wait_idle(engine: AsyncEngine, timeout: float = 10.0) -> tuple[int, int, int]:
    """Poll until no request runs or waits; returns (running, waiting, blocks used)."""
    deadline = time.monotonic() + timeout
    while True:
        state = engine.call(lambda e: (len(e.scheduler.running), len(e.scheduler.waiting), e.block_pool.num_used))
        if state == (0, 0, 0) or time.monotonic() > deadline:
            return state
        time.sleep(0.02)

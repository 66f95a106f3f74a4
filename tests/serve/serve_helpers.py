"""Helpers for the serving tests: a tiny tokenizer for the random model, engine configs,
ports, and polling the engine until it is idle."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from execstate.engine.async_engine import AsyncEngine
from execstate.engine.config import EngineConfig

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
def running_server(app) -> Iterator[tuple[str, uvicorn.Server]]:
    """Serve ``app`` with a real uvicorn on 127.0.0.1 in a thread; yields (base url, server)."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{server.config.port}", server
    finally:
        server.should_exit = True
        thread.join(10)

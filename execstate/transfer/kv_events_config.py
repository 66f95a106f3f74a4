"""``KVEventsConfig``: whether and where an engine publishes its KV cache events (docs/fleet.md).

The fields and defaults follow vLLM's ``KVEventsConfig`` (``--kv-events-config`` takes the same
JSON): ``enable_kv_cache_events`` (off by default), ``publisher`` (``"zmq"``; ``"null"`` records
nothing), ``endpoint`` (the PUB socket: ``tcp://*:5557``; port 0 picks a free one),
``replay_endpoint`` (the ROUTER socket a (re)connecting subscriber asks for the batches it missed;
``None``: no replay), ``buffer_steps`` (batches kept for replay), ``hwm`` (the PUB socket's
high-water mark), ``max_queue_size`` (batches waiting for the publisher thread; beyond it the
queue is dropped and an ``AllBlocksCleared`` published instead, so a subscriber's index only ever
loses entries, never keeps a block that is gone) and ``topic`` (the first frame of each message).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

PUBLISHERS = ("zmq", "null")


@dataclass(frozen=True)
class KVEventsConfig:
    enable_kv_cache_events: bool = False
    publisher: str = "zmq"
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    def __post_init__(self) -> None:
        if self.publisher not in PUBLISHERS:
            raise ValueError(f"kv events publisher must be one of {PUBLISHERS}, got {self.publisher!r}")
        for name in ("buffer_steps", "hwm", "max_queue_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"kv events {name} must be a positive int, got {value!r}")
        if not isinstance(self.endpoint, str) or "://" not in self.endpoint:
            raise ValueError(f"kv events endpoint must be a ZeroMQ address like tcp://*:5557, got {self.endpoint!r}")
        if self.replay_endpoint is not None and "://" not in str(self.replay_endpoint):
            raise ValueError(f"kv events replay_endpoint must be a ZeroMQ address, got {self.replay_endpoint!r}")

    @property
    def publishes(self) -> bool:
        return self.enable_kv_cache_events and self.publisher == "zmq"

    @classmethod
    def from_json(cls, text: str) -> KVEventsConfig:
        """Parse ``--kv-events-config``; ``ValueError`` naming an unknown or mistyped field."""
        try:
            raw: Any = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"--kv-events-config is not JSON: {e}") from None
        if not isinstance(raw, dict):
            raise ValueError("--kv-events-config must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"--kv-events-config: unknown field(s) {unknown}; known: {sorted(known)}")
        return cls(**raw)

"""``KVEventsConfig``: whether and where an engine publishes its KV cache events (docs/fleet.md).

The fields follow vLLM's ``KVEventsConfig`` (``--kv-events-config`` takes the same JSON):
``enable_kv_cache_events`` (off by default), ``publisher`` (``"zmq"``; ``"null"`` records
nothing), ``endpoint`` (the PUB socket: ``tcp://127.0.0.1:5557``, loopback, where vLLM binds
every interface; port 0 picks a free one; any non-loopback address is served with CURVE keys
derived from the instances' shared secret, and refused without one: ``auth.py``),
``replay_endpoint`` (the ROUTER socket a (re)connecting subscriber asks for the batches it missed;
``None``: no replay), ``buffer_steps`` (batches kept for replay), ``hwm`` (the PUB socket's
high-water mark), ``max_queue_size`` (batches waiting for the publisher thread; beyond it the
queue is dropped and an ``AllBlocksCleared`` published instead, so a subscriber's index only ever
loses entries, never keeps a block that is gone) and ``topic`` (the first frame of each message).

Two of execstate's own, private by default (a feed must not publish what tenants asked):
``include_token_ids`` (False: a ``BlockStored`` names block keys, never token ids; True: vLLM's
token ids too, for an external router that needs them, e.g. llm-d; the start-up log says so) and
``exclude_tenants`` (tenants whose blocks the feed never mentions).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

from execstate.identity.tenant import tenant_id

PUBLISHERS = ("zmq", "null")


@dataclass(frozen=True)
class KVEventsConfig:
    enable_kv_cache_events: bool = False
    publisher: str = "zmq"
    endpoint: str = "tcp://127.0.0.1:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""
    include_token_ids: bool = False
    exclude_tenants: tuple[str, ...] = ()

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
        if not isinstance(self.include_token_ids, bool):
            raise ValueError(f"kv events include_token_ids must be true or false, got {self.include_token_ids!r}")
        if isinstance(self.exclude_tenants, str) or not all(isinstance(t, str) for t in self.exclude_tenants):
            raise ValueError(f"kv events exclude_tenants must be a list of tenant names, got {self.exclude_tenants!r}")
        object.__setattr__(self, "exclude_tenants", tuple(tenant_id(t) for t in self.exclude_tenants))

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

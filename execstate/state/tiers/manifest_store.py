"""Hibernated sessions' manifests on the shared tier's Redis server (docs/offload.md "Hibernation").

A hibernated session's manifest (its control state and the keys of its units:
``session/lm/hibernation_wire.py``) is one Redis string under :func:`manifest_key` =
``<prefix><engine id>:<tenant>:<session id>``, written by the engine that hibernated the session
and read by any engine that wakes it (its own, or another replica sharing the server). The
store does not interpret the blob: the reader verifies its signature and contents.

**Claim**: the engine that wakes a session first deletes its manifest key; ``DEL`` is atomic on
the server, so of any number of engines trying, exactly one sees 1 and serves the session (the
others refuse). That single operation is the hand-over of a hibernated session: before it nobody
serves the session, after it only the claimant does (docs/security.md: at most one server).

Every call is bounded by ``timeout_s``; an error raises :class:`ManifestUnavailable` (the
caller decides: a wake then refuses, since it cannot know whether another engine claimed it).
Thread-safe (redis-py's connection pool).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis

# the key naming (pure, manifest_keys.py); manifest_key re-exported for the callers that import it here
from execstate.state.tiers.manifest_keys import DEFAULT_PREFIX
from execstate.state.tiers.manifest_keys import manifest_key as manifest_key


class ManifestUnavailable(Exception):
    """The Redis server could not be reached or answered with an error."""


class ManifestStore:
    def __init__(self, url: str, timeout_s: float = 1.0, prefix: str = DEFAULT_PREFIX) -> None:
        self.prefix = prefix
        self.client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)

    def manifest_key(self, engine_id: str, tenant: str, session_id: str) -> str:
        return manifest_key(engine_id, tenant, session_id, self.prefix)

    def put(self, key: str, blob: bytes, ttl_s: float) -> None:
        """Store (replace) the manifest under ``key`` for ``ttl_s`` seconds."""
        self._do(lambda: self.client.set(key, blob, px=max(1, int(ttl_s * 1000))))

    def get(self, key: str) -> bytes | None:
        data = self._do(lambda: self.client.get(key))
        return None if data is None else bytes(data)

    def exists(self, keys: list[str]) -> list[bool]:
        """Whether each of ``keys`` is stored (one pipelined round trip)."""
        if not keys:
            return []

        def run() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for k in keys:
                pipe.exists(k)
            return pipe.execute()

        return [bool(n) for n in self._do(run)]

    def claim(self, key: str) -> bool:
        """Delete ``key``; True for the one caller whose delete removed it (module docstring)."""
        return bool(self._do(lambda: self.client.delete(key)))

    def close(self) -> None:
        self.client.close()

    @staticmethod
    def _do(fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except redis.RedisError as e:
            raise ManifestUnavailable(f"{type(e).__name__}: {e}") from None

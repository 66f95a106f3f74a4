"""Helpers for the world-serving tests: a tiny random world model, a world server on a real
uvicorn, and a small WebSocket client that separates JSON events from chunks."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch
import uvicorn
from serve_helpers import free_port
from websockets.asyncio.client import ClientConnection

from execstate.model.world.config import WorldModelConfig
from execstate.model.world.model import ChunkedWorldModel
from execstate.model.world.transformer import WorldTransformer
from execstate.serve.realtime.world.app import build_world_app
from execstate.serve.realtime.world.encode import frame_sha256
from execstate.serve.realtime.world.host import WorldHost
from execstate.session.world.offline import World, scene_frames

TINY = WorldModelConfig(d_model=32, n_layers=2, n_heads=2, frames_per_chunk=2, text_dim=16, text_buckets=64,
                        window_chunks=2)
RECV_TIMEOUT_S = 60.0


def tiny_world_model(seed: int = 0) -> ChunkedWorldModel:
    """Random weights everywhere (as tests/model/world/conftest.py's ``random_net``)."""
    torch.manual_seed(seed)
    net = WorldTransformer(TINY)
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0.0, 0.2)
    net.eval()
    return ChunkedWorldModel(net, weights_version="tiny-random")


def offline_hashes(model, seed: int, prompt: str, chunks: list[dict]) -> list[str]:
    """The offline ``World`` session replaying what the chunks' metadata says each step used: the
    scene of ``seed`` as chunk 0, then per chunk its keys (an ``action`` event) and its prompt."""
    world = World(model, numerics=model.spec.numerics, max_sessions=1)
    try:
        s = world.open_session(prompt=prompt, seed=seed, scene_seed=seed)
        out = list(scene_frames(model.spec, seed, prompt))
        for meta in chunks[1:]:
            if meta["prompt"] is not None:
                s.submit_event(s.next_event_id(), "prompt", {"text": meta["prompt"]})
            out.extend(s.step(action=list(meta["keys"])).frames)
    finally:
        world.close()
    return [frame_sha256(fr) for fr in out]


@contextlib.contextmanager
def world_server(host: WorldHost) -> Iterator[str]:
    """A world-only app for ``host`` on a real uvicorn; yields its ``http://`` URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_world_app(host), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def ws_url(http_url: str) -> str:
    return http_url.replace("http://", "ws://", 1) + "/v1/realtime/video"


class WorldClient:
    """``events`` keeps every JSON event in order; ``chunks`` every (metadata, payload)."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []
        self.chunks: list[tuple[dict[str, Any], bytes]] = []

    async def send(self, msg: dict[str, Any] | str) -> None:
        await self.ws.send(json.dumps(msg) if isinstance(msg, dict) else msg)

    async def recv(self, timeout: float = RECV_TIMEOUT_S) -> dict[str, Any]:
        """The next JSON event (a chunk's metadata is returned after its payload is read)."""
        event = json.loads(await asyncio.wait_for(self.ws.recv(), timeout))
        self.events.append(event)
        if event["type"] == "video.chunk_metadata":
            payload = await asyncio.wait_for(self.ws.recv(), timeout)
            assert isinstance(payload, bytes) and len(payload) == event["byte_length"], event
            self.chunks.append((event, payload))
        return event

    async def until(self, kind: str, timeout: float = RECV_TIMEOUT_S) -> dict[str, Any]:
        while (event := await self.recv(timeout))["type"] != kind:
            pass
        return event

    async def ask(self, msg: dict[str, Any] | str, kind: str | None = None) -> dict[str, Any]:
        """Send and return the next event that is not a chunk (or the next of ``kind``)."""
        await self.send(msg)
        while True:
            event = await self.recv()
            if (kind is None and event["type"] not in ("video.chunk_metadata", "session.behind")) or event[
                    "type"] == kind:
                return event

    async def chunk(self) -> tuple[dict[str, Any], bytes]:
        await self.until("video.chunk_metadata")
        return self.chunks[-1]

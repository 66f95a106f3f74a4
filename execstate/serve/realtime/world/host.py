"""The world-session runtime as the world WebSocket uses it.

:class:`WorldHost` holds one world model for a server and its sessions: an ``execstate.World``
(``session/world_offline.py``: events applied at chunk boundaries, checkpoints, rollback, the
rolling K/V window) driven through ``AsyncWorld`` (``session/world_async.py``: steps on worker
threads, never on the event loop). At most ``max_sessions`` sessions are resident (beyond:
``SessionEventError`` ``capacity``); each holds at most ``session_memory_bytes`` of K/V, rounded
down to whole blocks (beyond, e.g. by pinning checkpoints: ``budget``), and runs at most
``max_frames`` frames (``session.create``'s ``num_frames``; ``convert.py``). The runtime's refusals
reach the client unchanged (code and message).

A session starts from the procedural world's scene (``scene_seed`` = the session's seed, or for a
model that knows only some scenes the one the seed picks among them, ``offline.known_scene``:
chunk 0 is that scene's first frames, committed as given) or, with ``start: "generate"``, from nothing
(its first step generates from the prompt). Frames equal the offline ``World`` session's for the
same model, seed, start and events at the same boundaries, bit for bit.

Ownership: a world session belongs to the tenant of the connection that started it (``world``
realm, held by the ``world`` kind of connection: no other surface reaches it) and counts against
its ``world_sessions`` quota (``policy``). The handlers of a connection use
``host.for_tenant(tenant)``, a view whose every call asks as that tenant.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from execstate.identity.tenant import LOCAL_TENANT, TenantId
from execstate.model.world.interface import WorldModel, WorldSpec
from execstate.serve.realtime.world.convert import fps_problem
from execstate.session.runtime.access import WORLD, Access, Owner
from execstate.session.runtime.manager import SessionPolicy
from execstate.session.world.async_world import AsyncWorld
from execstate.session.world.offline import World, known_scene, scene_frames
from execstate.session.world.sessions import WorldSessionInfo
from execstate.session.world.step import WorldStepResult

DEFAULT_MAX_SESSIONS = 8
DEFAULT_SESSION_MEMORY = 4 << 20
WORLD_HOLDER = "world"


def world_access(tenant: TenantId) -> Access:
    return Access(Owner(tenant, WORLD), WORLD_HOLDER)
DEFAULT_MAX_FRAMES = 100_000  # about 1 h 45 min at 16 fps


def session_blocks_for(spec: WorldSpec, memory_bytes: int) -> int:
    """The per-session K/V block budget that fits ``memory_bytes`` (the runtime's block size: one
    frame's tokens); at least the window and one chunk in flight, else ``ValueError``."""
    block_size = spec.kv.tokens_per_frame
    bpc = spec.kv.blocks_per_chunk(block_size)
    block_bytes = spec.kv.bytes_per_chunk() // bpc
    least = (spec.sink_chunks + spec.max_window_chunks + 1) * bpc
    blocks = memory_bytes // block_bytes
    if blocks < least:
        raise ValueError(f"--world-session-memory {memory_bytes} bytes holds {blocks} K/V blocks; a session needs "
                         f"at least {least} ({least * block_bytes} bytes: its window and one chunk in flight)")
    return blocks


class WorldHost:
    """The server's world model, its sessions (runtime) and their limits."""

    def __init__(
        self,
        model: WorldModel,
        model_name: str = "world",
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        session_memory_bytes: int = DEFAULT_SESSION_MEMORY,
        default_fps: float = 16.0,
        step_workers: int = 1,
        max_frames: int = DEFAULT_MAX_FRAMES,
        policy: SessionPolicy | None = None,
    ) -> None:
        if max_sessions < 1 or max_frames < 1:
            raise ValueError("max_sessions and max_frames must be >= 1")
        if (problem := fps_problem(default_fps)) is not None:
            raise ValueError(f"default {problem}")
        self.model = model
        self.spec = model.spec
        self.model_name = model_name
        self.max_sessions = max_sessions
        self.default_fps = default_fps
        self.max_frames = max_frames
        self.session_blocks = session_blocks_for(model.spec, session_memory_bytes)
        block_bytes = model.spec.kv.bytes_per_chunk() // model.spec.kv.blocks_per_chunk(model.spec.kv.tokens_per_frame)
        self.session_memory_bytes = self.session_blocks * block_bytes
        self.world = World(model, numerics=model.spec.numerics, max_sessions=max_sessions,
                           session_blocks=self.session_blocks, policy=policy)
        self.aw = AsyncWorld(self.world, step_workers).scoped(world_access(LOCAL_TENANT))

    def for_tenant(self, tenant: TenantId) -> WorldHost:
        """A view of this host whose every call asks as ``tenant`` (module docstring)."""
        view = object.__new__(WorldHost)
        view.__dict__.update(self.__dict__)
        view.aw = self.aw.scoped(world_access(tenant))
        return view

    def usage(self) -> dict[TenantId, int]:
        """World sessions resident per tenant (``/metrics``)."""
        with self.world.sessions.lock:
            return {t: c["world_sessions"] for t, c in self.world.sessions.manager.usage().items()}

    @property
    def num_sessions(self) -> int:
        return self.world.sessions.manager.num_resident

    async def open(self, prompt: str, seed: int, start: str, window_chunks: int | None) -> tuple[WorldSessionInfo,
                                                                                                  np.ndarray | None]:
        """A new session and its chunk 0 (the scene's frames; ``None`` for ``start: "generate"``)."""
        frames = scene_frames(self.spec, known_scene(self.spec, seed), prompt) if start == "render" else None
        info = await self.aw.open(prompt=prompt, seed=seed, start_frames=frames, window_chunks=window_chunks)
        return info, frames

    async def submit(self, session_id: str, event_id: int, kind: str, data: Any) -> None:
        await self.aw.submit_event(session_id, event_id, kind, data)

    async def step(self, session_id: str) -> WorldStepResult:
        return await self.aw.step(session_id)

    async def checkpoint(self, session_id: str) -> str:
        return await self.aw.checkpoint(session_id)

    async def rollback(self, session_id: str, checkpoint_id: str) -> WorldSessionInfo:
        await self.aw.rollback(session_id, checkpoint_id)
        return await self.aw.info(session_id)

    async def release(self, session_id: str, checkpoint_id: str) -> None:
        await self.aw.release_checkpoint(session_id, checkpoint_id)

    async def info(self, session_id: str) -> WorldSessionInfo:
        return await self.aw.info(session_id)

    async def close(self, session_id: str) -> None:
        await self.aw.close(session_id)

    def shutdown(self) -> None:
        """Close every session and stop the step workers (from outside the server's loop)."""
        asyncio.run(self.aw.shutdown())

"""The adapter between the world WebSocket and the world-session runtime.

:class:`WorldHost` holds one world model for a server and the sessions resident on it: at most
``max_sessions``, each with a KV memory budget (``session_memory_bytes``); beyond either bound
``open`` refuses at once (:class:`WorldCapacityError`, codes ``capacity`` and ``memory_budget``).
Steps run on the host's worker threads (``run``), never on the event loop.

:class:`WorldDriver` is one session: ``start`` (the first chunk), ``step(key, prompt)`` (the next
chunk), ``checkpoint`` / ``rollback`` / ``release``. It drives the offline driver
(``model.world.rollout.WorldRollout``: block pool, rolling window, prompt cache, carry, noise RNG),
so a session's frames equal the offline driver's for the same seed, start and keys, bit for bit.
This file is the only place the serving layer touches the runtime.

Memory: a session's KV pool holds ``session_memory_bytes`` worth of blocks (at least its rolling
window needs); a checkpoint pins the blocks of the table it saves, so ``checkpoint`` refuses
(``memory_budget``) when the pins would leave less than the window needs.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np

from execstate.model.world import renderer
from execstate.model.world.interface import WorldModel
from execstate.model.world.rollout import RolloutCheckpoint, WorldRollout
from execstate.model.world.window import RollingWindow

T = TypeVar("T")
BLOCK_SIZE = 16
DEFAULT_MAX_SESSIONS = 8
DEFAULT_SESSION_MEMORY = 16 << 20
MAX_CHECKPOINTS = 16


class WorldCapacityError(Exception):
    """A refusal beyond a bound (``code``: ``capacity`` or ``memory_budget``)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class WorldDriver:
    """One world session over the offline driver (see the module docstring)."""

    def __init__(self, model: WorldModel, session_id: str, seed: int, prompt: str, window_chunks: int | None,
                 memory_bytes: int) -> None:
        spec = model.spec
        self.model = model
        self.session_id = session_id
        self.seed = seed
        self.block_bytes = spec.kv.bytes_per_chunk() // spec.kv.blocks_per_chunk(BLOCK_SIZE)
        window_chunks = spec.max_window_chunks if window_chunks is None else window_chunks
        if not 1 <= window_chunks <= spec.max_window_chunks:
            raise ValueError(f"window_chunks must be in [1, {spec.max_window_chunks}], got {window_chunks}")
        max_chunks = RollingWindow(spec.sink_chunks, window_chunks).max_chunks
        self.window_blocks = (max_chunks + 1) * spec.kv.blocks_per_chunk(BLOCK_SIZE)
        num_blocks = memory_bytes // self.block_bytes
        if num_blocks < self.window_blocks:
            raise WorldCapacityError("memory_budget", f"a session with this window needs "
                                     f"{self.window_blocks * self.block_bytes} bytes of KV, over the per-session "
                                     f"budget of {memory_bytes} bytes (--world-session-memory)")
        self.rollout = WorldRollout(model, seed=seed, prompt=prompt, block_size=BLOCK_SIZE,
                                    window_chunks=window_chunks, num_blocks=num_blocks)
        self.memory_bytes = num_blocks * self.block_bytes
        self._checkpoints: dict[str, RolloutCheckpoint] = {}
        self._ids = itertools.count()

    @property
    def frames_per_chunk(self) -> int:
        return self.model.spec.frames_per_chunk

    def start(self, mode: str) -> np.ndarray:
        """The first chunk: the renderer's first frames for the seed (``render``; the theme from
        the prompt) committed as given, or generated from the prompt (``generate``)."""
        if mode == "render":
            f = self.frames_per_chunk
            theme = renderer.theme_for_prompt(self.rollout.prompt.prompt)
            keys = np.zeros(f, dtype=np.int64)
            _, frames = renderer.trajectory(renderer.initial_state(self.seed, theme), keys)
            return self.rollout.start(frames[:f], [0] * f)
        return self.rollout.start(None)

    def step(self, key: int, prompt: str | None) -> np.ndarray:
        if prompt is not None:
            self.rollout.set_prompt(prompt)
        return self.rollout.step([key] * self.frames_per_chunk)

    @property
    def prompt_version(self) -> int:
        return self.rollout.prompt.version

    @property
    def step_index(self) -> int:
        return self.rollout.steps

    def checkpoint(self) -> str:
        if len(self._checkpoints) >= MAX_CHECKPOINTS:
            raise WorldCapacityError("memory_budget", f"a session keeps at most {MAX_CHECKPOINTS} checkpoints; "
                                     "release one first")
        pinned = {b for cp in self._checkpoints.values() for c in cp.table for b in c}
        pinned |= {b for c in self.rollout.table for b in c}
        if len(pinned) + self.window_blocks > self.rollout.blocks.num_blocks:
            raise WorldCapacityError("memory_budget", "checkpoints would pin more KV than the session's budget "
                                     f"({self.memory_bytes} bytes) leaves for its window; release one first")
        cp_id = f"cp-{next(self._ids)}"
        self._checkpoints[cp_id] = self.rollout.checkpoint()
        return cp_id

    def rollback(self, cp_id: str) -> None:
        self.rollout.rollback(self._get(cp_id))

    def release(self, cp_id: str) -> None:
        self.rollout.release(self._get(cp_id))
        del self._checkpoints[cp_id]

    def _get(self, cp_id: str) -> RolloutCheckpoint:
        cp = self._checkpoints.get(cp_id)
        if cp is None:
            raise KeyError(cp_id)
        return cp

    def close(self) -> None:
        for cp_id in list(self._checkpoints):
            self.release(cp_id)


class WorldHost:
    """The server's world model, its resident sessions and the threads their steps run on."""

    def __init__(self, model: WorldModel, model_name: str = "world", max_sessions: int = DEFAULT_MAX_SESSIONS,
                 session_memory_bytes: int = DEFAULT_SESSION_MEMORY, default_fps: float = 16.0,
                 workers: int | None = None) -> None:
        if max_sessions < 1 or session_memory_bytes < 1 or default_fps < 0:
            raise ValueError("max_sessions and session_memory_bytes must be >= 1, default_fps >= 0")
        self.model = model
        self.model_name = model_name
        self.max_sessions = max_sessions
        self.session_memory_bytes = session_memory_bytes
        self.default_fps = default_fps
        self.sessions: dict[str, WorldDriver] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._pool = ThreadPoolExecutor(workers or max_sessions, thread_name_prefix="execstate-world")

    def open(self, seed: int, prompt: str, window_chunks: int | None) -> WorldDriver:
        """A new resident session, or ``WorldCapacityError``/``ValueError`` (nothing is kept then)."""
        with self._lock:
            if len(self.sessions) >= self.max_sessions:
                raise WorldCapacityError("capacity", f"{self.max_sessions} world sessions are resident "
                                         "(--world-max-sessions); try again when one ends")
            sid = f"world-{next(self._ids)}"
            self.sessions[sid] = None  # type: ignore[assignment]  # the place is taken while building
        try:
            driver = WorldDriver(self.model, sid, seed, prompt, window_chunks, self.session_memory_bytes)
        except BaseException:
            with self._lock:
                del self.sessions[sid]
            raise
        with self._lock:
            self.sessions[sid] = driver
        return driver

    def close(self, driver: WorldDriver) -> None:
        with self._lock:
            if self.sessions.get(driver.session_id) is driver:
                del self.sessions[driver.session_id]
        driver.close()

    @property
    def num_sessions(self) -> int:
        return len(self.sessions)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a world worker thread."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

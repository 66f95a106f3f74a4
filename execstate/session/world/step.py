"""One step of a world session: one chunk, in three phases (``session/world/sessions.py`` runs
the first and last under its lock, the middle one outside it).

1. :func:`prepare_world_step` runs inside ``SessionRuntime.begin_step`` (a refusal leaves the
   events pending and nothing changed): applies the boundary's events (``world_events``), builds
   the chunk's actions, re-encodes the prompt when a ``prompt`` event changed it (a new version;
   the frames' K/V are untouched), draws the chunk's noise from the session's generator, gathers
   the context (a window-sized copy of the sink + newest chunks' K/V) and allocates the new
   chunk's blocks. Everything the compute phase reads is now private to the step.
2. :func:`compute_world_step`: the few-step denoise and the commit (``sampler.generate_chunk``'s
   two halves: K/V written in place into the step's own blocks), then decode to uint8 frames. It touches no
   session state, so other sessions' calls and this session's event submissions proceed
   meanwhile.
3. :func:`finish_world_step` appends the chunk to the block table, rolls the window (releasing
   the middle chunks' blocks), and commits the new carry, generator state, prompt, held key and
   history key.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from execstate.model.world.interface import Carry, ChunkActions, ContextKV, KVWriter, PromptKV
from execstate.model.world.sampler import denoise_chunk
from execstate.session.runtime.events import Drained, SessionEventError
from execstate.session.world.events import ChunkControls, apply_boundary
from execstate.session.world.state import WorldState, step_history
from execstate.state.block_holds import HeldBlocks


@dataclass(frozen=True)
class WorldStepResult:
    """What one step produced (``docs/world-sessions.md``): ``frames`` uint8 ``[F, H, W, 3]``, the
    ``keys`` its frames were conditioned on, the prompt version, the boundary's event lists,
    ``timings`` in ms, the session's distinct K/V blocks after the step (checkpoints included) and,
    with a camera rig, each frame's camera ``(yaw, pitch)`` (session-relative radians; else None)."""

    session_id: str
    step_index: int
    frames: np.ndarray
    keys: tuple[str, ...]
    prompt_version: int
    events: dict[str, list[int]]
    timings: dict[str, float]
    blocks_in_use: int
    frames_sha256: str
    camera: tuple[tuple[float, float], ...] | None = None


@dataclass(eq=False)
class PreparedStep:
    step_index: int
    controls: ChunkControls
    actions: ChunkActions
    prompt: PromptKV
    noise: torch.Tensor
    rng_after: torch.Tensor
    ctx: ContextKV
    carry: Carry
    chunk: HeldBlocks
    t_begin: float
    gather_ms: float


@dataclass(eq=False)
class ComputedStep:
    latents: torch.Tensor
    carry: Carry
    frames: np.ndarray
    timings: dict[str, float]


def prepare_world_step(state: WorldState, drained: Drained, step_index: int, budget_blocks: int,
                       session_blocks: int) -> PreparedStep:
    """Phase 1 (module docstring). Raises ``SessionEventError`` (``invalid``, ``budget``,
    ``capacity``) before changing anything."""
    t0 = time.perf_counter()
    model, store = state.store.model, state.store
    spec = model.spec
    controls = apply_boundary(state.held, drained, spec.frames_per_chunk, state.camera, spec.camera)
    index = {k: i for i, k in enumerate(spec.keys)}
    try:
        actions = model.make_actions([index[k] for k in controls.keys],
                                     None if controls.camera is None else [list(c) for c in controls.camera])
    except ValueError as exc:
        raise SessionEventError("invalid", str(exc)) from None
    if session_blocks + store.blocks_per_chunk > budget_blocks:
        raise SessionEventError("budget", f"the next chunk needs {store.blocks_per_chunk} more K/V blocks but the "
                                f"session holds {session_blocks} of its budget of {budget_blocks} (checkpoints and "
                                "the window included); release checkpoints or close forks")
    prompt = state.prompt
    if controls.prompt is not None and controls.prompt != prompt.prompt:
        prompt = model.encode_prompt(controls.prompt, prompt.version + 1)
    gen = torch.Generator()
    gen.set_state(state.generator.get_state())
    noise = torch.randn((len(spec.schedule), *spec.chunk_latent_shape), generator=gen)
    ctx = model.gather_context(store.kv, state.context())
    if store.pool.num_free < store.blocks_per_chunk:
        raise SessionEventError("capacity", f"the shared K/V pool is full ({store.pool.num_blocks} blocks); "
                                "close sessions or give the World more num_blocks")
    chunk = store.allocate_chunk()
    return PreparedStep(step_index, controls, actions, prompt, noise, gen.get_state(), ctx, state.carry, chunk, t0,
                        (time.perf_counter() - t0) * 1000)


@torch.no_grad()
def compute_world_step(state: WorldState, prep: PreparedStep) -> ComputedStep:
    """Phase 2: denoise + commit into the step's own blocks, decode."""
    store = state.store
    model = store.model
    t0 = time.perf_counter()
    writer = KVWriter(store.kv, prep.chunk.block_ids, model.spec.kv)
    latents = denoise_chunk(model, prep.noise, prep.actions, prep.prompt, prep.ctx, prep.carry)
    t1 = time.perf_counter()
    carry = model.commit(latents, prep.actions, prep.prompt, prep.ctx, prep.carry, writer)
    t2 = time.perf_counter()
    frames = model.decode(latents)
    t3 = time.perf_counter()
    return ComputedStep(latents, carry, frames, {"gather_ms": round(prep.gather_ms, 3),
                                                 "denoise_ms": round((t1 - t0) * 1000, 3),
                                                 "commit_ms": round((t2 - t1) * 1000, 3),
                                                 "decode_ms": round((t3 - t2) * 1000, 3)})


def finish_world_step(session_id: str, state: WorldState, prep: PreparedStep, done: ComputedStep,
                      count_blocks: Callable[[], int]) -> WorldStepResult:
    """Phase 3: commit the chunk into the session state; the step's result."""
    spec = state.store.model.spec
    index = {k: i for i, k in enumerate(spec.keys)}
    state.append_chunk(prep.chunk, done.carry,
                       step_history([index[k] for k in prep.controls.keys], prep.controls.camera, prep.prompt))
    state.generator.set_state(prep.rng_after)
    state.prompt = prep.prompt
    state.held = prep.controls.held
    if prep.controls.camera_state is not None:
        state.camera = prep.controls.camera_state
    timings = dict(done.timings)
    timings["step_ms"] = round((time.perf_counter() - prep.t_begin) * 1000, 3)
    frames = done.frames
    camera = None
    if spec.camera is not None and prep.controls.camera is not None:
        camera = tuple((float(r[0]), float(r[1])) for r in prep.controls.camera)
    return WorldStepResult(session_id, prep.step_index, frames, prep.controls.keys, prep.prompt.version,
                           prep.controls.events, timings, count_blocks(),
                           hashlib.sha256(np.ascontiguousarray(frames).tobytes()).hexdigest(), camera)

"""The few-step sampler (rectified flow, x-prediction): one chunk from noise, model-agnostic.

``x_t = t * x1 + (1 - t) * noise`` with ``t = 0`` pure noise and ``t = 1`` clean. At each flow
time of the schedule the model predicts the clean chunk ``x1``; between iterations the
prediction is re-noised to the next flow time with a fresh noise draw (the few-step sampling of
DMD / Self-Forcing / CausVid). All noise is an input, drawn by the caller from the session's RNG,
so a step is reproducible from the RNG state.
"""

from __future__ import annotations

import torch

from execstate.model.world.interface import Carry, ChunkActions, ContextKV, KVWriter, PromptKV, WorldModel


def denoise_chunk(model: WorldModel, noise: torch.Tensor, actions: ChunkActions, prompt: PromptKV,
                  ctx: ContextKV, carry: Carry) -> torch.Tensor:
    """``noise [S, *chunk_latent_shape]`` -> the clean chunk's latents (writes nothing)."""
    sched = model.spec.schedule
    if noise.shape != (len(sched), *model.spec.chunk_latent_shape):
        raise ValueError(f"noise must have shape {(len(sched), *model.spec.chunk_latent_shape)}, "
                         f"got {tuple(noise.shape)}")
    x = noise[0]
    x1 = x
    for i, t in enumerate(sched):
        x1 = model.denoise_step(x, t, actions, prompt, ctx, carry)
        if i + 1 < len(sched):
            nt = sched[i + 1]
            x = nt * x1 + (1.0 - nt) * noise[i + 1]
    return x1


def generate_chunk(model: WorldModel, noise: torch.Tensor, actions: ChunkActions, prompt: PromptKV,
                   ctx: ContextKV, carry: Carry, writer: KVWriter) -> tuple[torch.Tensor, Carry]:
    """One step: denoise, then commit the clean chunk through ``writer``; returns its latents and
    the next carry."""
    x1 = denoise_chunk(model, noise, actions, prompt, ctx, carry)
    return x1, model.commit(x1, actions, prompt, ctx, carry, writer)

"""Teacher forcing over chunk sequences with the causal chunk mask (the training forward).

The sequence holds ``N`` clean chunks followed by their ``N`` noisy copies (CausVid /
Self-Forcing teacher forcing). Chunk-level attention (then expanded to tokens):

- clean chunk ``i`` attends to clean chunks ``j <= i`` -- what a commit pass sees;
- noisy chunk ``i`` attends to clean chunks ``j < i`` and to itself -- what a denoise step
  sees (the cached clean K/V of earlier chunks, plus the chunk being denoised).

Clean and noisy copies of a chunk share its time positions (``i * F + frame``, see
:mod:`rope`), its actions, its prompt and its carry (the frame before it). Clean chunks run at flow time 1 (clean),
noisy ones at their sampled ``t``; the loss is on the noisy chunks' predictions of the clean latents.
"""

from __future__ import annotations

import torch

from execstate.model.world import rope
from execstate.model.world.config import WorldModelConfig
from execstate.model.world.latent_codec import LatentCodec
from execstate.model.world.transformer import WorldTransformer
from execstate_bench.world_tools.data import Batch


def chunk_mask(n: int, tokens_per_chunk: int) -> torch.Tensor:
    """bool ``[2n * tpc, 2n * tpc]``: True where a query token may attend to a key token."""
    i = torch.arange(n)
    m = torch.zeros((2 * n, 2 * n), dtype=torch.bool)
    m[:n, :n] = i[None, :] <= i[:, None]
    m[n:, :n] = i[None, :] < i[:, None]
    m[n:, n:] = torch.eye(n, dtype=torch.bool)
    return m.repeat_interleave(tokens_per_chunk, 0).repeat_interleave(tokens_per_chunk, 1)


def predict(model: WorldTransformer, batch: Batch, t: torch.Tensor, noise: torch.Tensor,
            clean_noise: torch.Tensor | None = None, carry_noise: torch.Tensor | None = None,
            context: torch.Tensor | None = None, local_only: bool = False) -> torch.Tensor:
    """Predicted clean latents of the noisy chunks, ``[B, N, tpc, latent_dim]`` (the network's raw output: patches,
    or palette logits).

    ``t [B, N]`` flow times of the noisy chunks, ``noise`` like ``batch.latents``;
    ``clean_noise`` (like ``batch.latents``) and ``carry_noise`` (like ``batch.carry``), optional,
    are added to the clean chunks and to the carries; ``context`` (like ``batch.latents``), optional,
    replaces the clean chunks (:func:`own_history`): context corruption, so the model learns to
    correct small errors of its own in the cache and the carry instead of compounding them
    (GameNGen's noise augmentation). ``local_only``: the convolutional path alone (no attention,
    no prompt; training's first stage)."""
    cfg: WorldModelConfig = model.cfg
    b, n, tpc, dim = batch.latents.shape
    x1 = batch.latents
    xt = t[:, :, None, None] * x1 + (1 - t[:, :, None, None]) * noise
    clean = x1 if context is None else context  # the clean chunks the sequence attends to
    clean = clean if clean_noise is None else clean + clean_noise
    x = torch.cat([clean, xt], dim=1).reshape(b, 2 * n * tpc, dim)
    tt = torch.cat([torch.ones_like(t), t], dim=1)
    actions = batch.actions.repeat(1, 2)
    pos = rope.token_frame_positions(n * cfg.frames_per_chunk, 0, cfg.tokens_per_frame).repeat(2)
    cos, sin = rope.tables(pos, cfg.tokens_per_frame, cfg.head_dim)
    ids = batch.word_ids.repeat(1, 2, 1).reshape(b * 2 * n, -1)
    pmask = batch.word_mask.repeat(1, 2, 1).reshape(b * 2 * n, -1)
    carry = batch.carry if carry_noise is None else batch.carry + carry_noise
    if local_only:  # only the noisy chunks: the conv path sees no other chunk
        out, _, _ = model(xt.reshape(b, n * tpc, dim), carry, t, batch.actions, None, cos, sin, None, None, None,
                          None, None, None, local_only=True)
        return out.reshape(b, n, tpc, dim)
    pk, pv = model.prompt_kv(ids)
    carry = carry.repeat(1, 2, 1, 1, 1)
    out, _, _ = model(x, carry, tt, actions, None, cos, sin, None, None, chunk_mask(n, tpc), pk, pv, pmask,
                      out_groups=n)
    return out.reshape(b, n, tpc, dim)



@torch.no_grad()
def own_history(model: WorldTransformer, batch: Batch, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Context latents and carries for :func:`predict` where, for the samples with ``mask [B]``
    set, the clean chunks after the sink are the model's own first-sampler-step predictions (flow
    time 0, from the true history) and the carries of chunks 2.. come from those predictions (the
    targets stay the true latents).

    A rollout feeds the model its own outputs as context and carry, which teacher forcing never
    shows it, so its errors compound (measured before this: the agent at the right place in 75 %
    of the frames after one step, 12 % after four). Training on its own one-step errors with the
    true continuation as the target teaches it to correct them (Self-Forcing's point, one step
    deep, at the price of one extra forward without gradients)."""
    cfg: WorldModelConfig = model.cfg
    b, n, tpc, dim = batch.latents.shape
    f, nc, p = cfg.frames_per_chunk, cfg.carry_frames, cfg.tokens_per_frame
    pred = LatentCodec(cfg).snap(
        predict(model, batch, torch.zeros((b, n)), torch.zeros_like(batch.latents)).to(torch.float32)
    )
    context = batch.latents.clone()
    context[:, 1:] = torch.where(mask[:, None, None, None], pred[:, 1:], batch.latents[:, 1:])
    carry = batch.carry.clone()
    if nc <= f and n > 2:
        own = pred[:, 1:-1].reshape(b, n - 2, f, p, dim)[:, :, f - nc :]
        carry[:, 2:] = torch.where(mask[:, None, None, None, None], own, batch.carry[:, 2:])
    return context, carry

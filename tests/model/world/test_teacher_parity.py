"""Oracle: the cached, chunk-by-chunk inference path (gather context -> denoise; commit) computes
the same predictions as the teacher-forced training forward over the whole sequence with the
causal chunk mask. This ties the paged K/V, the context positions and the prompt per chunk to
what training optimises."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from conftest import TINY, random_net

from execstate.model.world.config import WorldModelConfig
from execstate.model.world.interface import KVWriter, PromptKV
from execstate.model.world.model import ChunkedWorldModel
from execstate.state.kv_pool import KVPool
from execstate_bench.world_tools import data, teacher

# the palette codec with every option of the convolutional path (cell_conv.py), at F = 2 and at
# F = 1 (fewer frames per chunk than carry frames: the first carries after the sink are partly
# "no frame")
CONV = dataclasses.replace(TINY, codec="palette", cell_size=4, action_shift_px=1, conv_channels=8, conv_layers=3,
                           conv_keys=True, conv_prev_frame=True)
CONV_F1 = dataclasses.replace(CONV, frames_per_chunk=1, window_chunks=3)


def test_cached_inference_matches_teacher_forcing(tiny_model: ChunkedWorldModel) -> None:
    _check_parity(tiny_model, TINY)


@pytest.mark.parametrize("cfg", [CONV, CONV_F1], ids=["conv-f2", "conv-f1"])
def test_cached_inference_matches_teacher_forcing_with_the_conv_path(cfg: WorldModelConfig) -> None:
    _check_parity(ChunkedWorldModel(random_net(cfg), weights_version="tiny-conv"), cfg)


def _check_parity(tiny_model: ChunkedWorldModel, cfg: WorldModelConfig) -> None:
    net = tiny_model.net
    batch = data.sample_batch(np.random.default_rng(3), cfg, 3, max_start=6, p_theme_change=0.7)
    b, n = batch.latents.shape[:2]
    g = torch.Generator().manual_seed(0)
    t = torch.rand((b, n), generator=g)
    noise = torch.randn(batch.latents.shape, generator=g)
    with torch.no_grad():
        expected = teacher.predict(net, batch, t, noise)
    kv = tiny_model.spec.kv
    shape = tiny_model.spec.chunk_latent_shape
    bpc = kv.blocks_per_chunk(16)
    for s in range(b):
        pool = KVPool(kv.num_layers, bpc * n, 16, kv.num_kv_heads, kv.head_dim, kv.dtype)
        chunks: list[list[int]] = []
        for i in range(n):
            with torch.no_grad():
                pk, pv = net.prompt_kv(batch.word_ids[s, i][batch.word_mask[s, i]][None])
            prompt = PromptKV(i, "", pk, pv)
            f = cfg.frames_per_chunk
            actions = tiny_model.make_actions(batch.actions[s, i * f : (i + 1) * f].tolist())
            ctx = tiny_model.gather_context(pool, chunks)
            x1 = batch.latents[s, i].view(shape)
            xt = t[s, i] * x1 + (1 - t[s, i]) * noise[s, i].view(shape)
            carry = batch.carry[s, i]
            got = tiny_model.denoise_step(xt, float(t[s, i]), actions, prompt, ctx, carry)
            want = expected[s, i] if cfg.codec == "patch" else tiny_model.codec.snap(expected[s, i])  # snapped cells
            torch.testing.assert_close(got.view(-1, shape[-1]), want, atol=2e-5, rtol=1e-4)
            ids = list(range(i * bpc, (i + 1) * bpc))
            nxt = tiny_model.commit(x1, actions, prompt, ctx, carry, KVWriter(pool, ids, kv))
            if i + 1 < n and i > 0:  # contiguous chunks: the carry is the frames before the next chunk
                assert torch.equal(nxt, batch.carry[s, i + 1])
            chunks.append(ids)


def test_carry_frames_before_the_first_frame_are_zeros_as_in_a_session() -> None:
    """F = 1 < carry_frames: the chunk right after the sink has one real frame before it; the
    other carry slot is "no frame" (zeros), exactly what a rollout's initial carry gives it."""
    batch = data.sample_batch(np.random.default_rng(5), CONV_F1, 4, max_start=1)  # contiguous windows
    sink, first, second = batch.latents[:, 0], batch.latents[:, 1], batch.latents[:, 2]
    assert torch.equal(batch.carry[:, 0], torch.zeros_like(batch.carry[:, 0]))
    assert torch.equal(batch.carry[:, 1, 0], torch.zeros_like(sink))
    assert torch.equal(batch.carry[:, 1, 1], sink)
    assert torch.equal(batch.carry[:, 2], torch.stack([sink, first], dim=1))
    assert torch.equal(batch.carry[:, 3], torch.stack([first, second], dim=1))
    model = ChunkedWorldModel(random_net(CONV_F1), weights_version="tiny-conv")
    assert torch.equal(torch.cat([model.initial_carry(), sink[0][None]])[-2:], batch.carry[0, 1])

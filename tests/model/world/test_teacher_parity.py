"""Oracle: the cached, chunk-by-chunk inference path (gather context -> denoise; commit) computes
the same predictions as the teacher-forced training forward over the whole sequence with the
causal chunk mask. This ties the paged K/V, the context positions and the prompt per chunk to
what training optimises."""

from __future__ import annotations

import numpy as np
import torch
from conftest import TINY

from execstate.model.world import data, teacher
from execstate.model.world.interface import KVWriter, PromptKV
from execstate.model.world.model import ChunkedWorldModel
from execstate.state.kv_pool import KVPool


def test_cached_inference_matches_teacher_forcing(tiny_model: ChunkedWorldModel) -> None:
    net = tiny_model.net
    batch = data.sample_batch(np.random.default_rng(3), TINY, 3, max_start=6, p_theme_change=0.7)
    b, n = batch.latents.shape[:2]
    g = torch.Generator().manual_seed(0)
    t = torch.rand((b, n), generator=g)
    noise = torch.randn(batch.latents.shape, generator=g)
    with torch.no_grad():
        expected = teacher.predict(net, batch, t, noise)
    kv = tiny_model.spec.kv
    shape = tiny_model.spec.chunk_latent_shape
    for s in range(b):
        pool = KVPool(kv.num_layers, 2 * n, 16, kv.num_kv_heads, kv.head_dim, kv.dtype)
        chunks: list[list[int]] = []
        for i in range(n):
            with torch.no_grad():
                pk, pv = net.prompt_kv(batch.word_ids[s, i][batch.word_mask[s, i]][None])
            prompt = PromptKV(i, "", pk, pv)
            f = TINY.frames_per_chunk
            actions = tiny_model.make_actions(batch.actions[s, i * f : (i + 1) * f].tolist())
            ctx = tiny_model.gather_context(pool, chunks)
            x1 = batch.latents[s, i].view(shape)
            xt = t[s, i] * x1 + (1 - t[s, i]) * noise[s, i].view(shape)
            carry = batch.carry[s, i]
            got = tiny_model.denoise_step(xt, float(t[s, i]), actions, prompt, ctx, carry)
            torch.testing.assert_close(got.view(-1, shape[-1]), expected[s, i], atol=2e-5, rtol=1e-4)
            ids = [2 * i, 2 * i + 1]
            nxt = tiny_model.commit(x1, actions, prompt, ctx, carry, KVWriter(pool, ids, kv))
            if i + 1 < n and i > 0:  # contiguous chunks: the carry is the frame before the next chunk
                assert torch.equal(nxt, batch.carry[s, i + 1])
            chunks.append(ids)

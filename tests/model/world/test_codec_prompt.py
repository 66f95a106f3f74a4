"""Codec (pixels <-> patch latents), prompt hashing and the model config."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from execstate.model.world import codec, renderer
from execstate.model.world.config import WorldModelConfig
from execstate.model.world.prompt import word_ids
from execstate_bench.world_tools import data


@settings(max_examples=30, deadline=None)
@given(frames=arrays(np.uint8, (2, 16, 32, 3)), patch=st.sampled_from([4, 8, 16]))
def test_codec_round_trip_is_exact(frames: np.ndarray, patch: int) -> None:
    if frames.shape[1] != frames.shape[2]:
        frames = np.concatenate([frames, frames], axis=1)
    lat = codec.encode(frames, patch)
    assert lat.shape == (2, (32 // patch) ** 2, patch * patch * 3) and lat.dtype == torch.float32
    assert float(lat.min()) >= -1.0 and float(lat.max()) <= 1.0
    assert np.array_equal(codec.decode(lat, patch), frames)


def test_codec_patch_layout() -> None:
    frame = np.zeros((32, 32, 3), np.uint8)
    frame[8:16, 0:8] = 255  # patch row 1, column 0 -> token 4 (row-major, 4 patches per row)
    lat = codec.encode(frame, 8)
    assert torch.equal((lat > 0).all(-1), torch.arange(16) == 4)


def test_codec_decode_clips_and_rounds() -> None:
    lat = torch.tensor([[[-3.0, 0.0, 2.0] * 64]])
    assert codec.decode(lat, 8).reshape(-1, 3)[0].tolist() == [0, 128, 255]


def test_codec_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="uint8"):
        codec.encode(np.zeros((32, 32, 3), np.float32), 8)
    with pytest.raises(ValueError, match="multiple"):
        codec.encode(np.zeros((30, 30, 3), np.uint8), 8)
    with pytest.raises(ValueError, match="square"):
        codec.decode(torch.zeros(15, 192), 8)


def test_word_ids_are_stable_and_a_bag_of_words() -> None:
    # golden values: sha256 under the domain tag (never Python hash())
    assert word_ids("A snow maze, the SNOW!", 256, 8) == [0, 60, 2, 196, 26]
    assert word_ids("", 256, 8) == [0]
    assert len(word_ids(" ".join(f"w{i}" for i in range(20)), 256, 8)) == 9
    with pytest.raises(TypeError):
        word_ids(None, 256, 8)  # type: ignore[arg-type]


def test_theme_words_have_their_own_buckets() -> None:
    cfg = WorldModelConfig()
    themes = {word_ids(t, cfg.text_buckets, 8)[1] for t in renderer.THEME_NAMES}
    fillers = {word_ids(w, cfg.text_buckets, 8)[1] for w in data.FILLERS}
    assert len(themes) == len(renderer.THEME_NAMES) and not themes & fillers


def test_config_round_trip_and_validation() -> None:
    cfg = WorldModelConfig(d_model=64, n_heads=2, schedule=(0.0, 0.25, 0.5))
    assert WorldModelConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.tokens_per_frame == 16 and cfg.tokens_per_chunk == 32 and cfg.patch_dim == 432
    for bad in (dict(patch_size=5), dict(d_model=30, n_heads=4), dict(schedule=(0.5, 0.0)), dict(schedule=(1.0,)),
                dict(window_chunks=0)):
        with pytest.raises(ValueError):
            WorldModelConfig(**bad)
    with pytest.raises(ValueError, match="unknown"):
        WorldModelConfig.from_dict({"depth": 3})


def test_training_batch_layout() -> None:
    cfg = WorldModelConfig(frames_per_chunk=2)
    b = data.sample_batch(np.random.default_rng(0), cfg, 3, max_start=1)
    n = cfg.sink_chunks + cfg.window_chunks + 1
    assert b.latents.shape == (3, n, 32, 432) and b.actions.shape == (3, n * 2)
    assert b.word_ids.shape == b.word_mask.shape == (3, n, 9)
    assert bool(b.word_mask[:, :, 0].all()) and bool((b.word_ids[~b.word_mask] == 0).all())
    assert int(b.actions[:, 0].abs().sum()) == 0  # the first frame's key is ignored (none)
    # max_start=1: contiguous chunks; the frame before chunk 1 is chunk 0's last frame
    changed = (b.latents[:, 1, :16] != b.latents[:, 0, 16:]).any(-1)
    assert torch.equal(changed, b.changed[:, 1, :16].any(-1))

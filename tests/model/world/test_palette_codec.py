"""The palette codec (palette_codec.py, latent_codec.py) against the renderer, and a palette-codec
model through the plug-in contract."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from conftest import TINY, random_net
from hypothesis import given, settings
from hypothesis import strategies as st

from execstate.model.world import palette_codec, renderer, shift
from execstate.model.world.latent_codec import LatentCodec
from execstate.model.world.model import ChunkedWorldModel
from execstate.model.world.rollout import WorldRollout

PAL = dataclasses.replace(TINY, codec="palette", cell_size=4, action_shift_px=1)


def _frames(seed: int, n: int, theme: str) -> tuple[list[renderer.SceneState], np.ndarray]:
    keys = renderer.random_actions(np.random.default_rng(seed), n)
    return renderer.trajectory(renderer.initial_state(seed, theme), keys)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), theme=st.sampled_from(renderer.THEME_NAMES))
def test_decode_of_encode_is_the_rendered_frame(seed: int, theme: str) -> None:
    _, frames = _frames(seed, 6, theme)
    lat = palette_codec.encode(frames, 12, 4)
    assert lat.shape == (6, 16, 9 * palette_codec.K)
    assert set(torch.unique(lat).tolist()) == {-1.0, 1.0}
    assert torch.equal((lat > 0).sum(-1), torch.full((6, 16), 9))  # one entry per cell
    assert np.array_equal(palette_codec.decode(lat, 12, 4), frames)


def test_cell_indices_name_the_drawn_colours() -> None:
    states, frames = _frames(5, 2, "snow")
    idx = palette_codec.cell_indices(frames[0], 4).numpy()
    colours = palette_codec.PALETTE[idx]
    y, x = states[0].agent
    assert tuple(colours[y, x]) == renderer.AGENT_RGB
    floor, wall = renderer.THEMES["snow"]
    assert (colours[states[0].walls] == wall).all()
    assert tuple(colours[0, 0]) == wall and palette_codec.K == 15


def test_snap_is_the_one_hot_of_the_argmax_and_idempotent() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn((2, 16, 9 * palette_codec.K), generator=g)
    s = palette_codec.snap(logits, 12, 4)
    assert np.array_equal(palette_codec.decode(s, 12, 4), palette_codec.decode(logits, 12, 4))
    assert torch.equal(palette_codec.snap(s, 12, 4), s)
    assert torch.equal(palette_codec.encode(palette_codec.decode(s, 12, 4), 12, 4), s)


def test_loss_is_the_cross_entropy_per_cell() -> None:
    _, frames = _frames(1, 2, "desert")
    target = palette_codec.encode(frames, 12, 4)
    w = torch.ones((2, 16, 9))
    assert float(palette_codec.loss(target * 50.0, target, w)) < 1e-6  # confident and right
    uniform = float(palette_codec.loss(torch.zeros_like(target), target, w))
    assert abs(uniform - np.log(palette_codec.K)) < 1e-5
    w2 = torch.zeros((2, 16, 9))
    w2[0, 0, 0] = 1.0  # only one cell counts: its own cross-entropy
    wrong = target.clone()
    wrong[0, 0, : palette_codec.K] = torch.roll(target[0, 0, : palette_codec.K], 1) * 3.0
    expected = float(torch.nn.functional.cross_entropy(wrong[0, 0, : palette_codec.K][None],
                                                       target[0, 0, : palette_codec.K].argmax()[None]))
    assert abs(float(palette_codec.loss(wrong, target, w2)) - expected) < 1e-6


def test_shift_moves_palette_cells_like_the_renderer_moves_the_agent() -> None:
    keys = np.array([renderer.NONE, renderer.RIGHT, renderer.DOWN])
    for seed in range(100):
        states, frames = renderer.trajectory(renderer.initial_state(seed), keys)
        if states[1].agent[1] == states[0].agent[1] + 1 and states[2].agent[0] == states[1].agent[0] + 1:
            break
    lat = palette_codec.encode(frames[:1], 12, 4)[None]
    out = shift.shifted_carry(lat, torch.tensor(np.asarray(keys[1:])[None]), 2, 3, 1, palette_codec.K)
    for f in range(2):
        frame = palette_codec.decode(out[0, 0, f], 12, 4)
        assert renderer.locate_agent(frame) == renderer.agent_center(states[f + 1])


def test_latent_codec_and_config_agree_on_the_palette_layout() -> None:
    assert PAL.latent_grid == 3 and PAL.latent_channels == 15 and PAL.latent_dim == 135
    assert TINY.latent_dim == TINY.patch_dim == 432
    lc = LatentCodec(PAL)
    changed = torch.zeros((1, 16, 135), dtype=torch.bool)
    changed[0, 2, 15 * 4 + 7] = True  # token 2, cell 4, one entry
    assert lc.unit_mask(changed).nonzero().tolist() == [[0, 2, 4]]
    with pytest.raises(ValueError, match="codec"):
        dataclasses.replace(TINY, codec="vq")
    with pytest.raises(ValueError, match="cell_size"):
        dataclasses.replace(TINY, codec="palette", cell_size=5)
    for bad in (dict(conv_channels=8), dict(codec="palette", cell_size=4, conv_channels=-1),
                dict(codec="palette", cell_size=4, conv_keys=True), dict(codec="palette", cell_size=4,
                                                                          conv_prev_frame=True)):
        with pytest.raises(ValueError, match="conv_channels"):
            dataclasses.replace(TINY, **bad)
    with pytest.raises(ValueError, match="conv_layers"):
        dataclasses.replace(TINY, codec="palette", cell_size=4, conv_channels=8, conv_layers=1)


@pytest.mark.parametrize("conv", [0, 8])
def test_a_palette_model_commits_only_valid_frames_and_replays_bit_for_bit(conv: int) -> None:
    model = ChunkedWorldModel(random_net(dataclasses.replace(PAL, conv_channels=conv)), weights_version="tiny-palette")
    assert model.spec.chunk_latent_shape == (2, 16, 135)
    _, frames = _frames(3, 2, "meadow")
    keys = [renderer.RIGHT, renderer.UP]
    ro = WorldRollout(model, seed=7, prompt="a meadow maze")
    ro.start(frames, [0, 0])
    cp = ro.checkpoint()
    first = [ro.step(keys) for _ in range(3)]
    palette = {tuple(c) for c in palette_codec.PALETTE}
    for chunk in first:
        assert {tuple(c) for c in chunk.reshape(-1, 3)} <= palette
        assert np.array_equal(palette_codec.decode(palette_codec.encode(chunk, 12, 4), 12, 4), chunk)
    ro.rollback(cp)
    again = [ro.step(keys) for _ in range(3)]
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))

"""The action-shifted carry (shift.py) against a numpy oracle and the renderer."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from execstate.model.world import codec, renderer, shift


def _oracle(frame: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """The frame moved by (dy, dx) pixels, edge pixels repeated."""
    h, w = frame.shape[:2]
    rows = np.clip(np.arange(h) - dy, 0, h - 1)
    cols = np.clip(np.arange(w) - dx, 0, w - 1)
    return frame[rows][:, cols]


@settings(max_examples=25, deadline=None)
@given(keys=st.lists(st.integers(0, 4), min_size=4, max_size=4), seed=st.integers(0, 1000))
def test_shift_matches_the_numpy_oracle(keys: list[int], seed: int) -> None:
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 256, size=(2, 48, 48, 3), dtype=np.uint8)  # two groups
    last = codec.encode(frames, 12)[None]  # [1, G=2, P, patch_dim]
    out = shift.shifted_carry(last, torch.tensor(np.asarray(keys)[None]), 2, 12, 4)
    assert out.shape == (1, 2, 2, 16, 432)
    for g in range(2):
        dy = dx = 0
        for f in range(2):
            my, mx = shift.KEY_MOVES[keys[2 * g + f]]
            dy, dx = dy + 4 * my, dx + 4 * mx
            np.testing.assert_array_equal(codec.decode(out[0, g, f], 12), _oracle(frames[g], dy, dx))


def test_a_free_move_puts_the_agent_where_the_renderer_does() -> None:
    keys = np.array([renderer.NONE, renderer.RIGHT, renderer.DOWN])
    for seed in range(100):
        states, frames = renderer.trajectory(renderer.initial_state(seed), keys)
        if states[1].agent[1] == states[0].agent[1] + 1 and states[2].agent[0] == states[1].agent[0] + 1:
            break
    out = shift.shifted_carry(codec.encode(frames[:1], 12)[None], torch.tensor(np.asarray(keys[1:])[None]), 2, 12, 4)
    for f in range(2):
        assert renderer.locate_agent(codec.decode(out[0, 0, f], 12)) == renderer.agent_center(states[f + 1])

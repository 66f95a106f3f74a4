"""The first frames of a scene of a procedural world: how a session of a model trained on that world
starts (``WorldSpec.world`` names it; ``session/world/offline.py`` commits them as chunk 0).

- ``grid``: the top-down maze (``renderer.py``): the state of ``scene_seed`` in the prompt's theme,
  ``n`` frames with no key;
- ``maze``: the first-person maze (``maze/``): the maze of ``scene_seed`` seen from its start pose,
  ``n`` times (no key, no turn), in the prompt's theme.
"""

from __future__ import annotations

import numpy as np

WORLDS = ("grid", "maze")


def scene_frames(world: str, scene_seed: int, prompt: str, n: int) -> np.ndarray:
    """uint8 ``[n, H, W, 3]`` (module docstring); ``ValueError`` for an unknown world or a bad seed."""
    if isinstance(scene_seed, bool) or not isinstance(scene_seed, int) or scene_seed < 0:
        raise ValueError(f"scene_seed must be a non-negative int, got {scene_seed!r}")
    if world == "grid":
        from execstate.model.world import renderer

        state = renderer.initial_state(scene_seed, renderer.theme_for_prompt(prompt))
        return renderer.trajectory(state, np.zeros(n, dtype=np.int64))[1]
    if world == "maze":
        from execstate.model.world.maze import layout, pose, raycast
        from execstate.model.world.maze.textures import theme_for_prompt

        m = layout.generate(scene_seed)
        frame = raycast.render(m, pose.start_pose(m), theme_for_prompt(prompt))
        return np.repeat(frame[None], n, axis=0)
    raise ValueError(f"unknown world {world!r}; known: {', '.join(WORLDS)}")

"""``execstate.World()`` runs the default (shipped) world model: a session from a procedural scene
steps 48x48 frames, its identity names the shipped weights, and a held key moves the agent the
key's way (the quality against the renderer is measured by tests/model/world and bench world)."""

from __future__ import annotations

import numpy as np

from execstate import World
from execstate.model.world import renderer
from execstate.model.world.weights import WEIGHTS_FILE, file_sha256
from execstate.model.world_default import SHIPPED_DIR, load_default_world_model
from execstate.session.world.offline import scene_frames


def test_default_world_runs_the_shipped_model() -> None:
    model = load_default_world_model(prefer_prepared=False)
    assert model.spec.weights_version == file_sha256(SHIPPED_DIR / WEIGHTS_FILE)
    with World(model=model) as world:
        assert world.sessions.store.provenance.weights_version == model.spec.weights_version
        s = world.open_session(prompt="a meadow maze", seed=0, scene_seed=0)
        start = renderer.locate_agent(scene_frames(model.spec, 0, "a meadow maze")[-1])
        s.submit_event(0, "key", {"key": "right", "down": True})
        xs = []
        for _ in range(4):
            r = s.step()
            assert r.frames.shape == (2, 48, 48, 3) and r.frames.dtype == np.uint8
            found = renderer.locate_agent(r.frames[-1])
            assert found is not None
            xs.append(found[1])
        truth = renderer.initial_state(0, renderer.theme_for_prompt("a meadow maze"))
        _, frames = renderer.trajectory(truth, np.array([0, 0] + [renderer.RIGHT] * 8))
        want = renderer.locate_agent(frames[-1])
        assert start is not None and want is not None
        assert want[1] > start[1]  # the renderer's agent moves right in this scene
        assert xs[-1] > start[1]  # so does the model's (how exactly: tests/model/world, bench world quality)
    world.sessions.check_integrity()

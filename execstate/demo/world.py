"""Part 2 of the tour: a world session steered live, checked against the renderer.

The shipped world model (``model/world/``) runs as a session (``execstate.World``): it starts from
a scene of the procedural world, generates one chunk of frames per step, takes a held key as an
event applied at a chunk boundary, and is checkpointed and rolled back. The renderer that made the
model's training data plays the same keys from the same scene; the demo prints how many generated
frames equal the renderer's pixel for pixel and saves both as a PNG strip. Rolling back to the
checkpoint and stepping again with the same input reproduces the frames bit for bit.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from execstate.model.world import renderer
from execstate.model.world.strip import StripRow, strip_png

PROMPT = "a meadow maze"
SCENE_SEED = 1
STEPS = 8  # chunks generated after the scene's first chunk
KEY_AT = 2  # the right key is held from this step on
CHECKPOINT_AT = 5  # checkpoint after this step; the next step goes "up" once, then it is replayed


def run_world(out_dir: Path) -> bool:
    from execstate import World

    t0 = time.perf_counter()
    ok = True
    with World() as world:
        spec = world.model.spec
        s = world.open_session(prompt=PROMPT, seed=0, scene_seed=SCENE_SEED)
        print(f"world model: {spec.frame_shape[1]}x{spec.frame_shape[0]} frames, {spec.frames_per_chunk} per chunk, "
              f"{len(spec.schedule)} denoise iterations; session {s.session_id} from scene {SCENE_SEED}, "
              f"prompt {PROMPT!r}")
        frames, keys = [], []
        for step in range(1, STEPS + 1):
            if step == KEY_AT:
                s.submit_event(0, "key", {"key": "right", "down": True})
                print("  event 0: key 'right' held (queued; applied at the next chunk boundary)")
            action = "up" if step == CHECKPOINT_AT + 1 else None
            r = s.step(action=action) if action else s.step()
            print(f"  step {r.step_index}: keys {'/'.join(r.keys)}, events started {r.events['started']}, "
                  f"{r.timings.get('step_ms', 0.0):.0f} ms, K/V blocks {r.blocks_in_use}")
            if step == CHECKPOINT_AT:
                cp = s.checkpoint()
                print(f"  checkpoint {cp.checkpoint_id} after step {step} (pins the window's K/V blocks, no copy)")
            if action:
                s.rollback(cp)
                again = s.step(action=action)
                same = again.frames_sha256 == r.frames_sha256
                ok &= same
                print(f"  rollback to {cp.checkpoint_id}, the same step again: frames "
                      f"{'identical bit for bit' if same else 'DIFFERENT'} (sha256 {r.frames_sha256[:12]}...)")
            frames.append(r.frames)
            keys.extend(r.keys)
        s.close()
    generated = np.concatenate(frames)
    f = spec.frames_per_chunk
    actions = np.array([renderer.NONE] * f + [renderer.ACTIONS.index(k) for k in keys], dtype=np.int64)
    state = renderer.initial_state(SCENE_SEED, renderer.theme_for_prompt(PROMPT))
    _, truth = renderer.trajectory(state, actions)
    truth = truth[f:]
    exact = int(sum(np.array_equal(g, t) for g, t in zip(generated, truth, strict=True)))
    hits = sum(_agent_near(g, t) for g, t in zip(generated, truth, strict=True))
    ok &= hits >= len(generated) * 3 // 4
    half = len(generated) // 2
    rows = [StripRow(f"world session, scene {SCENE_SEED}, steps {a // f + 1}-{b // f}", generated[a:b], truth[a:b],
                     keys[a:b]) for a, b in ((0, half), (half, len(generated)))]
    path = strip_png(rows, out_dir / "world.png")
    print(f"against the renderer (same scene, same keys): {exact}/{len(generated)} frames equal pixel for pixel, "
          f"agent where the renderer puts it in {hits}/{len(generated)}")
    print(f"saved {path} (top: the model's frames, bottom: the renderer's)")
    print(f"world part {'passed' if ok else 'FAILED'} in {time.perf_counter() - t0:.1f} s")
    return bool(ok)


def _agent_near(generated: np.ndarray, truth: np.ndarray, tolerance_px: float = 1.0) -> bool:
    a, b = renderer.locate_agent(generated), renderer.locate_agent(truth)
    return a is not None and b is not None and abs(a[0] - b[0]) <= tolerance_px and abs(a[1] - b[1]) <= tolerance_px

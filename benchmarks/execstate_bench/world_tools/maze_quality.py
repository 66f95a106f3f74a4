"""The maze world model against its renderer over scripted play: ``python -m execstate_bench.world_tools.maze_quality``.

A session of the model (the offline ``World``: the runtime's events, camera, rolling window) is played
by :class:`maze_script.ScriptedPlayer` for ``steps`` chunks from scene ``scene_seed``; the renderer
plays the same keys and the same camera (each frame's pose as the session reports it) through the
world's physics: the *true pose*. Per frame:

- **PSNR and SSIM** of the model's frame against the renderer's at the true pose (the model's view
  error; chunk 0, the rendered start, is not counted);
- **walls crossed**: on every frame where the walker pushes into a wall (its key's move was stopped
  by the physics), the position the model's frame shows along the push (``maze_metrics.read_position``)
  is read back; a frame whose position is through a wall (the segment from the true pose crosses a
  wall cell) counts, and so does each push that has one;
- **revisits**: each full spin on the spot (360 degrees: with the camera in 16 chunks, inside the
  model's window, or with the turn key in 32, longer than it) compares the model's frame after the
  spin with its frame before it (the same view), and both with the renderer's.

A baseline: the single frame that is closest to all the renderer's frames of the run (their
per-pixel mean; a model that hedged everything would draw it), with its PSNR and SSIM.

The trend after step 200 is the least-squares slope of the per-step PSNR (dB per 100 steps). The
report is JSON; ``--png`` plots PSNR and SSIM over the steps, with the pushes, crossings and spins
marked, above strips of the model's frames and the renderer's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from execstate.model.world.maze import layout, pose, raycast
from execstate.model.world.maze.textures import theme_for_prompt
from execstate_bench.world_tools.maze_metrics import psnr, read_position, ssim
from execstate_bench.world_tools.maze_script import ScriptedPlayer

STRIP_STEPS = (1, 100, 250, 500, 750, 1000)


@dataclass
class Play:
    psnr: list[float] = field(default_factory=list)  # per frame, from chunk 1 on
    ssim: list[float] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    push_frames: list[int] = field(default_factory=list)
    crossed_frames: list[int] = field(default_factory=list)
    pushes: int = 0
    crossed_pushes: int = 0
    spins: list[dict[str, Any]] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)
    strips: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    truth: list[np.ndarray] = field(default_factory=list)  # the renderer's frames (for the baseline)


def _move_dir(key: str, yaw: float) -> float | None:
    return {"forward": yaw, "back": yaw + math.pi, "left": yaw - math.pi / 2, "right": yaw + math.pi / 2}.get(key)


def play(model: Any, steps: int, scene_seed: int, prompt: str, seed: int = 0,
         check_walls: bool = True) -> Play:
    """One scripted session of ``steps`` chunks (module docstring)."""
    from execstate.session.world.offline import World

    maze = layout.generate(scene_seed)
    theme = theme_for_prompt(prompt)
    start = pose.start_pose(maze)
    out = Play()
    world = World(model, max_sessions=1)
    try:
        s = world.open_session(prompt=prompt, seed=seed, scene_seed=scene_seed)
        player = ScriptedPlayer(maze, seed)
        p, rel_yaw, moved, in_push, push_crossed = start, 0.0, True, False, False
        held: str | None = None
        # (generated frame, the renderer's) at the last frame; at the start of a spin; before this step
        last_frame: tuple[np.ndarray, np.ndarray] | None = None
        spin_start: tuple[np.ndarray, np.ndarray] | None = None
        last_frames_before_step: tuple[np.ndarray, np.ndarray] | None = None
        spin_kind = ""
        for step in range(1, steps + 1):
            c = player.next(p, rel_yaw, moved)
            want = None if c.key == "none" else c.key
            if want != held:
                if want is None:
                    s.submit_event(s.next_event_id(), "key", {"key": held, "down": False})
                else:
                    s.submit_event(s.next_event_id(), "key", {"key": want, "down": True})
                held = want
            if c.camera is not None:
                s.submit_event(s.next_event_id(), "camera", c.camera)
            if c.label.startswith("spin") and spin_start is None:
                spin_start, spin_kind = last_frame, c.label
            last_frames_before_step = last_frame
            r = s.step()
            out.step_ms.append(r.timings["step_ms"])
            moved = False
            assert r.camera is not None  # a maze session's step reports its camera
            for f, frame in enumerate(r.frames):
                key = r.keys[f]
                yaw_rel, pitch = r.camera[f]
                q = pose.step(maze, p, key, start.yaw + yaw_rel, pitch)
                truth = raycast.render(maze, q, theme)
                out.truth.append(truth)
                i = len(out.psnr)
                out.psnr.append(psnr(frame, truth))
                out.ssim.append(ssim(frame, truth))
                out.labels.append(c.label)
                d = _move_dir(key, q.yaw)
                pushing = False
                if d is not None:
                    speed = pose.MOVE_SPEED if key in ("forward", "back") else pose.STRAFE_SPEED
                    got = (q.x - p.x) * math.cos(d) + (q.z - p.z) * math.sin(d)
                    pushing = got < 0.5 * speed
                    moved |= got > 0.01
                if pushing:
                    out.push_frames.append(i)
                    if not in_push:
                        out.pushes += 1
                        push_crossed = False
                    if check_walls and d is not None:  # pushing implies a direction
                        seen = read_position(frame, maze, q, d, theme)
                        if pose.crossed_wall(maze, q, seen):
                            out.crossed_frames.append(i)
                            if not push_crossed:
                                out.crossed_pushes += 1
                                push_crossed = True
                in_push = pushing
                p = q
                rel_yaw = yaw_rel
                last_frame = (frame, truth)
            if step in STRIP_STEPS and last_frame is not None:
                out.strips[step] = (r.frames[-1], last_frame[1])
            if not c.label.startswith("spin") and spin_start is not None and last_frames_before_step is not None:
                (before, truth_before), (after, truth_after) = spin_start, last_frames_before_step
                out.spins.append({"step": step - 1, "kind": spin_kind, "model_after_vs_before": psnr(after, before),
                                  "before_vs_truth": psnr(before, truth_before),
                                  "after_vs_truth": psnr(after, truth_after)})
                spin_start = None
        s.close()
    finally:
        world.close()
    return out


def report(pl: Play, frames_per_chunk: int) -> dict[str, Any]:
    per_step = np.asarray(pl.psnr).reshape(-1, frames_per_chunk).mean(axis=1)
    steps = np.arange(1, len(per_step) + 1)
    late = steps >= 200
    slope = float(np.polyfit(steps[late], per_step[late], 1)[0] * 100) if late.sum() > 2 else None
    halves = np.array_split(per_step[late], 2) if late.sum() > 2 else []
    labels = np.asarray(pl.labels)
    mean_frame = np.asarray(np.round(np.mean(pl.truth, axis=0)), dtype=np.uint8)  # the best single frame, in MSE
    by_label = {lab: round(float(np.mean(np.asarray(pl.psnr)[labels == lab])), 2) for lab in sorted(set(pl.labels))}
    return {
        "steps": len(per_step), "frames": len(pl.psnr), "psnr_mean_db": round(float(np.mean(pl.psnr)), 3),
        "ssim_mean": round(float(np.mean(pl.ssim)), 4),
        "baseline_mean_frame": {"psnr_mean_db": round(float(np.mean([psnr(mean_frame, t) for t in pl.truth])), 3),
                                "ssim_mean": round(float(np.mean([ssim(mean_frame, t) for t in pl.truth])), 4)},
        "psnr_by_100_steps": [round(float(x.mean()), 2)
                              for x in np.array_split(per_step, max(1, len(per_step) // 100))],
        "psnr_slope_after_200_db_per_100_steps": None if slope is None else round(slope, 3),
        "psnr_after_200_halves": [round(float(h.mean()), 2) for h in halves],
        "psnr_by_label": by_label, "push_frames": len(pl.push_frames), "pushes": pl.pushes,
        "walls_crossed_frames": len(pl.crossed_frames), "walls_crossed_pushes": pl.crossed_pushes,
        "spins": pl.spins, "step_ms_p50": round(float(np.median(pl.step_ms)), 2),
    }


def plot(pl: Play, frames_per_chunk: int, path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per_step = np.asarray(pl.psnr).reshape(-1, frames_per_chunk).mean(axis=1)
    ss = np.asarray(pl.ssim).reshape(-1, frames_per_chunk).mean(axis=1)
    steps = np.arange(1, len(per_step) + 1)
    fig = plt.figure(figsize=(12, 9))
    ax = fig.add_subplot(3, 1, 1)
    ax.plot(steps, per_step, lw=0.6, color="tab:blue", alpha=0.5, label="PSNR per step")
    k = 25
    if len(per_step) > k:
        ax.plot(steps[k - 1 :], np.convolve(per_step, np.ones(k) / k, "valid"), color="tab:blue", lw=2,
                label=f"mean of {k} steps")
    ax.axhline(22, color="tab:red", ls="--", lw=1, label="goal 22 dB")
    for i in pl.push_frames:
        ax.axvline(i // frames_per_chunk + 1, color="0.85", lw=0.5, zorder=0)
    for i in pl.crossed_frames:
        ax.axvline(i // frames_per_chunk + 1, color="tab:red", lw=1)
    for sp in pl.spins:
        ax.axvline(sp["step"], color="tab:green", lw=1, ls=":")
    ax.set_ylabel("PSNR vs renderer (dB)")
    ax.set_title(title + " (grey: pushing into a wall; red: a wall crossed; green: end of a 360-degree spin)")
    ax.legend(loc="lower left", fontsize=8)
    ax2 = fig.add_subplot(3, 1, 2, sharex=ax)
    ax2.plot(steps, ss, lw=0.8, color="tab:purple")
    ax2.set_ylabel("SSIM vs renderer")
    ax2.set_xlabel("step (chunk of 2 frames)")
    ax3 = fig.add_subplot(3, 1, 3)
    chosen = sorted(pl.strips)
    if chosen:
        top = np.concatenate([pl.strips[s][0] for s in chosen], axis=1)
        bottom = np.concatenate([pl.strips[s][1] for s in chosen], axis=1)
        ax3.imshow(np.concatenate([top, bottom], axis=0), interpolation="nearest")
        ax3.set_xticks([32 + 64 * i for i in range(len(chosen))], [f"step {s}" for s in chosen])
        ax3.set_yticks([32, 96], ["model", "renderer"])
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m execstate_bench.world_tools.maze_quality",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default="maze", help="a trained maze model directory, or 'maze' (shipped)")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--scene-seed", type=int, default=3)
    ap.add_argument("--prompt", default="a dungeon maze")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-walls", action="store_true", help="skip the wall-crossing check (faster)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--png", type=Path, default=None)
    a = ap.parse_args(argv)
    import torch

    from execstate.session.world.offline import load_world_model

    torch.set_num_threads(a.threads)
    model = load_world_model(a.model)
    t0 = time.perf_counter()
    pl = play(model, a.steps, a.scene_seed, a.prompt, check_walls=not a.no_walls)
    rep = {"model": str(a.model), "weights_version": model.spec.weights_version, "scene_seed": a.scene_seed,
           "prompt": a.prompt, "wall_s": round(time.perf_counter() - t0, 1), "load": os.getloadavg(),
           **report(pl, model.spec.frames_per_chunk)}
    print(json.dumps(rep, indent=1))
    if a.json:
        a.json.write_text(json.dumps(rep, indent=1) + "\n")
    if a.png:
        plot(pl, model.spec.frames_per_chunk, a.png, f"maze model vs renderer, scene {a.scene_seed}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Quality of a world model against the renderer (the ground truth: same start, same actions).

Every episode starts from ``renderer.initial_state(seed, theme)``: chunk 0 (the sink) is the
renderer's first ``F`` frames, committed as given; then the model generates ``steps`` chunks for
random held keys (``renderer.random_actions``), and the renderer plays the same keys.

- **action following**: the agent's centre recovered from each generated frame by colour
  segmentation (``renderer.locate_agent``) vs the renderer's; a frame is a hit when the agent is
  found within ``tolerance_px`` (default 1 px: half a move) on both axes. Accuracy = hits /
  frames, over every generated frame.
- **exact frames**: the share of generated frames equal to the renderer's, pixel for pixel.
- **PSNR** of each generated frame against the renderer's, per step (chunk) index (99 dB for an
  exact frame, so a mean over steps mostly counts exact frames).
- **drift** over a long rollout with the rolling window: per segment of steps, PSNR, action
  accuracy, the share of frames where an agent is found at all, and *palette fidelity* (share of pixels within 48 RGB
  units of a colour that can occur in the scene: floor, wall, agent, movers) -- a model that drifts blurs or invents
  colours even where it still follows the keys; plus KV blocks in use and the process's peak
  resident memory (bounded memory: blocks stay constant).
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from execstate.model.world import renderer
from execstate.model.world.interface import WorldModel
from execstate.model.world.rollout import WorldRollout
from execstate.model.world.strip import StripRow, strip_png


@dataclass
class Episode:
    keys: np.ndarray  # int64 [(steps + 1) * F]
    truth: np.ndarray  # uint8 [(steps + 1) * F, H, W, 3]
    generated: np.ndarray  # uint8 [steps * F, H, W, 3] (chunk 0 excluded: it is the given start)
    centers: np.ndarray  # float [(steps + 1) * F, 2] renderer agent centres
    step_ms: list[float] = field(default_factory=list)
    blocks_in_use: list[int] = field(default_factory=list)


def run_episode(model: WorldModel, seed: int, steps: int, theme: str | None = None, window_chunks: int | None = None,
                noise_seed: int = 0) -> Episode:
    f = model.spec.frames_per_chunk
    rng = np.random.default_rng(10_000 + seed)
    theme = theme or renderer.THEME_NAMES[seed % len(renderer.THEME_NAMES)]
    keys = renderer.random_actions(rng, (steps + 1) * f)
    keys[0] = renderer.NONE
    states, truth = renderer.trajectory(renderer.initial_state(seed, theme), keys)
    ro = WorldRollout(model, seed=noise_seed, prompt=f"a {theme} maze", window_chunks=window_chunks)
    ro.start(truth[:f], keys[:f])
    out, times, used = [], [], []
    for i in range(1, steps + 1):
        t0 = time.perf_counter()
        out.append(ro.step(keys[i * f : (i + 1) * f]))
        times.append((time.perf_counter() - t0) * 1000)
        used.append(ro.blocks_in_use)
    centers = np.array([renderer.agent_center(s) for s in states])
    return Episode(keys, truth, np.concatenate(out), centers, times, used)


def psnr(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per-frame PSNR (dB) of uint8 frames ``[..., H, W, 3]``; identical frames give 99."""
    mse = ((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean(axis=(-3, -2, -1))
    return np.where(mse == 0, 99.0, 10 * np.log10(255.0**2 / np.maximum(mse, 1e-12)))


def agent_hits(ep: Episode, f: int, tolerance_px: float = 1.0) -> np.ndarray:
    """bool per generated frame: agent found within ``tolerance_px`` of the renderer's position."""
    hits = np.zeros(len(ep.generated), dtype=bool)
    for i, frame in enumerate(ep.generated):
        found = renderer.locate_agent(frame)
        if found is not None:
            hits[i] = max(abs(found[0] - ep.centers[f + i][0]), abs(found[1] - ep.centers[f + i][1])) <= tolerance_px
    return hits


def palette_fidelity(frames: np.ndarray, theme: str, tolerance: float = 48.0) -> float:
    colours = np.array([*renderer.THEMES[theme], renderer.AGENT_RGB, *renderer.MOVER_RGB], np.float32)
    d = np.linalg.norm(frames.astype(np.float32)[..., None, :] - colours, axis=-1).min(-1)
    return float((d <= tolerance).mean())


def evaluate(model: WorldModel, seeds: range = range(8), steps: int = 64, psnr_steps: int = 8) -> dict[str, Any]:
    """Action following over ``steps`` steps and PSNR per step for the first ``psnr_steps``, averaged
    over episodes ``seeds`` (themes cycle through all of them)."""
    f = model.spec.frames_per_chunk
    hits, per_step, moved_hits, step_ms, exact = [], [], [], [], []
    for seed in seeds:
        ep = run_episode(model, seed, steps)
        h = agent_hits(ep, f)
        hits.append(h)
        moved = np.any(ep.centers[f:] != ep.centers[f - 1 : -1], axis=1)
        moved_hits.append(h[moved])
        per_step.append(psnr(ep.generated, ep.truth[f:]).reshape(steps, f).mean(axis=1))
        exact.append((ep.generated == ep.truth[f:]).all(axis=(1, 2, 3)))
        step_ms.extend(ep.step_ms)
    p = np.mean(per_step, axis=0)
    return {
        "episodes": len(seeds), "steps": steps, "frames_per_chunk": f,
        "action_accuracy": float(np.concatenate(hits).mean()),
        "action_accuracy_when_moving": float(np.concatenate(moved_hits).mean()),
        "action_accuracy_by_step16": _by_16_steps(hits, f),
        "exact_frames": float(np.concatenate(exact).mean()),
        "exact_frames_by_step16": _by_16_steps(exact, f),
        "psnr_by_step": [round(float(x), 2) for x in p[:psnr_steps]],
        "psnr_mean_first": round(float(p[:psnr_steps].mean()), 2),
        "psnr_mean_all": round(float(p.mean()), 2),
        "step_ms_p50": round(float(np.percentile(step_ms, 50)), 2),
    }


def _by_16_steps(per_frame: list[np.ndarray], f: int) -> list[float] | None:
    """Means over episodes of each stretch of 16 steps (``16 * f`` frames), or ``None`` when the
    episodes are not a whole number of stretches."""
    x = np.stack(per_frame)
    if x.shape[1] % (16 * f):
        return None
    return [float(v) for v in x.reshape(len(per_frame), -1, 16 * f).mean(axis=(0, 2))]


def drift(model: WorldModel, seed: int = 0, steps: int = 500, segment: int = 50,
          window_chunks: int | None = None) -> dict[str, Any]:
    """A ``steps``-step rollout with the rolling window; metrics per segment of ``segment`` steps."""
    f = model.spec.frames_per_chunk
    theme = renderer.THEME_NAMES[seed % len(renderer.THEME_NAMES)]
    ep = run_episode(model, seed, steps, theme=theme, window_chunks=window_chunks)
    hits = agent_hits(ep, f).reshape(steps, f)
    found = np.array([renderer.locate_agent(frame) is not None for frame in ep.generated]).reshape(steps, f)
    p = psnr(ep.generated, ep.truth[f:]).reshape(steps, f)
    segs = []
    for s in range(0, steps, segment):
        frames = ep.generated[s * f : (s + segment) * f]
        segs.append({"steps": [s + 1, min(s + segment, steps)], "psnr": round(float(p[s : s + segment].mean()), 2),
                     "action_accuracy": round(float(hits[s : s + segment].mean()), 3),
                     "agent_found": round(float(found[s : s + segment].mean()), 3),
                     "palette_fidelity": round(palette_fidelity(frames, theme), 4)})
    return {
        "steps": steps, "theme": theme, "segments": segs,
        "blocks_in_use_max": int(max(ep.blocks_in_use)), "blocks_in_use_last": int(ep.blocks_in_use[-1]),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "step_ms_p50": round(float(np.percentile(ep.step_ms, 50)), 2),
        "step_ms_p99": round(float(np.percentile(ep.step_ms, 99)), 2),
    }


def comparison_png(model: WorldModel, path: Path, seeds: tuple[int, ...] = (1, 2), steps: int = 8,
                   late_steps: int = 500, scale: int = 4) -> Path:
    """PNG (``strip.strip_png``): row pairs of generated frames (top) above the renderer's (bottom)
    for the same keys, ``steps * F`` frames per row, each frame's key under it: the first ``steps``
    steps of the episodes ``seeds`` (chunk 0, the given start, left out), then (``late_steps > 0``)
    the last ``steps`` steps of a ``late_steps``-step rollout with the rolling window (seed 0)."""
    f = model.spec.frames_per_chunk

    def names(keys: np.ndarray) -> list[str]:
        return [renderer.ACTIONS[int(k)] for k in keys]

    rows: list[StripRow] = []
    for seed in seeds:
        ep = run_episode(model, seed, steps)
        rows.append(StripRow(f"seed {seed}: steps 1-{steps}", ep.generated, ep.truth[f:], names(ep.keys[f:])))
    if late_steps:
        ep = run_episode(model, 0, late_steps)
        lo = (late_steps - steps) * f
        rows.append(StripRow(f"seed 0: steps {late_steps - steps + 1}-{late_steps} of a {late_steps}-step rollout "
                             f"(rolling window)", ep.generated[lo:], ep.truth[f + lo :], names(ep.keys[f + lo :])))
    return strip_png(rows, path, scale)

"""Frame metrics of the maze quality bench: PSNR, SSIM, and the walker's position read back from a
generated frame (to count walls walked through)."""

from __future__ import annotations

import math

import numpy as np

from execstate.model.world.maze import layout, pose, raycast

_C1 = (0.01 * 255) ** 2
_C2 = (0.03 * 255) ** 2


def psnr(a: np.ndarray, b: np.ndarray, cap: float = 99.0) -> float:
    """dB between two uint8 frames (``cap`` for identical frames)."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return cap if mse == 0 else min(cap, 10 * math.log10(255.0**2 / mse))


def _gauss(x: np.ndarray, sigma: float = 1.5, radius: int = 5) -> np.ndarray:
    t = np.arange(-radius, radius + 1)
    k = np.exp(-(t**2) / (2 * sigma**2))
    k /= k.sum()
    pad = np.pad(x, ((radius, radius), (radius, radius), (0, 0)), mode="reflect")
    rows = sum(k[i] * pad[i : i + x.shape[0]] for i in range(len(k)))
    return sum(k[i] * rows[:, i : i + x.shape[1]] for i in range(len(k)))


def ssim(a: np.ndarray, b: np.ndarray) -> float:
    """Mean SSIM over pixels and RGB channels (Wang et al. 2004: an 11-tap Gaussian window, sigma
    1.5, the usual constants) of two uint8 frames."""
    x, y = a.astype(np.float64), b.astype(np.float64)
    mx, my = _gauss(x), _gauss(y)
    vx = _gauss(x * x) - mx * mx
    vy = _gauss(y * y) - my * my
    cxy = _gauss(x * y) - mx * my
    s = ((2 * mx * my + _C1) * (2 * cxy + _C2)) / ((mx * mx + my * my + _C1) * (vx + vy + _C2))
    return float(s.mean())


def read_position(frame: np.ndarray, maze: layout.Maze, truth: pose.Pose, direction: float, theme: str,
                  reach: float = 1.5, step: float = 0.05, margin_db: float = 1.0) -> pose.Pose:
    """The pose along ``direction`` (radians) from the true pose whose rendering the generated frame
    matches best (offsets ``-0.3 .. reach`` cells, the true yaw and pitch): where the frame puts the
    walker along the way it was pushing. Poses inside and beyond a wall render too (the raycaster
    then sees through the wall), so a frame that shows the walker through a wall reads as such. A
    pose other than the true one is read only if it matches better by ``margin_db`` (a blurred frame
    that fits every pose about as well reads as the true pose)."""
    best, best_p = truth, psnr(frame, raycast.render(maze, truth, theme)) + margin_db
    for off in np.arange(-0.3, reach + 1e-9, step):
        cand = pose.Pose(truth.x + off * math.cos(direction), truth.z + off * math.sin(direction), truth.yaw,
                         truth.pitch)
        if not (0 < cand.x < layout.GRID and 0 < cand.z < layout.GRID):
            break
        p = psnr(frame, raycast.render(maze, cand, theme))
        if p > best_p:
            best, best_p = cand, p
    return best

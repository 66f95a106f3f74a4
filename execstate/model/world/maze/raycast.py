"""The raycaster of the maze world: ``render(maze, pose, theme)`` -> ``uint8[SIZE, SIZE, 3]``.

A cylindrical camera: column ``c`` looks along the world angle ``yaw + (c + 0.5 - SIZE/2) *
DTHETA`` (``pose.DTHETA``: 256 columns a full circle, a field of view of 90 degrees), so a column's
pixels depend only on its world angle and the walker's position and pitch: turning by ``k``
columns' angle shifts the frame ``k`` columns sideways, exactly. Vertically it is a pinhole of the
same angular resolution at the horizon (``FOCAL = 1 / DTHETA`` pixels per unit at distance 1), the
eye half a cell above the floor; pitch shears the picture (the horizon moves ``pitch / DTHETA``
rows), as the raycasters of the 1990s did.

Per column, a grid walk (DDA) finds the first wall cell along the ray: its distance ``d`` (along
the ray) sets the wall's height ``FOCAL / d``, its face (x or z) the shade, where the ray hits the
face the texture column. Floor and ceiling: flat colours with a faint checker of the cells,
darkened by distance. Objects: billboards standing on the floor, drawn far to near where nearer
than the wall of their column. Everything fades into the theme's fog with distance. Pure
numpy, no state: the same inputs give the same frame.
"""

from __future__ import annotations

import numpy as np

from execstate.model.world.maze.layout import GRID, Maze
from execstate.model.world.maze.pose import DTHETA, Pose
from execstate.model.world.maze.textures import SPRITES, TEX, THEMES, WALL_TEXTURES

SIZE = 64
FOCAL = 1.0 / DTHETA
EYE = 0.5  # eye height (cells); walls are 1 cell tall
OBJECT_HEIGHT = 0.7
OBJECT_WIDTH = 0.6
_FACE_SHADE = (1.0, 0.78)
_CHECKER = 0.06
_EPS = 1e-9


def column_angles(yaw: float) -> np.ndarray:
    return yaw + (np.arange(SIZE) + 0.5 - SIZE / 2) * DTHETA


def cast(maze: Maze, x: float, z: float, angles: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per ray: distance to the first wall, face (0: an x face, 1: a z face), wall kind, texture
    coordinate ``u`` in [0, 1)."""
    dx, dz = np.cos(angles), np.sin(angles)
    mx = np.full(angles.shape, int(np.floor(x)))
    mz = np.full(angles.shape, int(np.floor(z)))
    ddx = np.abs(1.0 / np.where(np.abs(dx) < _EPS, _EPS, dx))
    ddz = np.abs(1.0 / np.where(np.abs(dz) < _EPS, _EPS, dz))
    sx = np.where(dx < 0, -1, 1)
    sz = np.where(dz < 0, -1, 1)
    side_x = np.where(dx < 0, (x - mx) * ddx, (mx + 1 - x) * ddx)
    side_z = np.where(dz < 0, (z - mz) * ddz, (mz + 1 - z) * ddz)
    face = np.zeros(angles.shape, np.int64)
    hit = np.zeros(angles.shape, bool)
    dist = np.zeros(angles.shape)
    for _ in range(4 * GRID):
        todo = ~hit
        if not todo.any():
            break
        step_x = todo & (side_x < side_z)
        step_z = todo & ~step_x
        dist = np.where(step_x, side_x, np.where(step_z, side_z, dist))
        mx = mx + np.where(step_x, sx, 0)
        mz = mz + np.where(step_z, sz, 0)
        side_x = side_x + np.where(step_x, ddx, 0.0)
        side_z = side_z + np.where(step_z, ddz, 0.0)
        face = np.where(step_x, 0, np.where(step_z, 1, face))
        inside = (mx >= 0) & (mx < GRID) & (mz >= 0) & (mz < GRID)
        wall = np.where(inside, maze.walls[np.clip(mz, 0, GRID - 1), np.clip(mx, 0, GRID - 1)] > 0, True)
        hit |= todo & wall
    kind = maze.walls[np.clip(mz, 0, GRID - 1), np.clip(mx, 0, GRID - 1)].astype(np.int64) - 1
    hx, hz = x + dist * dx, z + dist * dz
    u = np.where(face == 0, hz - np.floor(hz), hx - np.floor(hx))
    u = np.where(((face == 0) & (dx < 0)) | ((face == 1) & (dz > 0)), 1.0 - u, u)  # textures read left to right
    return dist, face, np.maximum(kind, 0), u


def render(maze: Maze, pose: Pose, theme: str) -> np.ndarray:
    """The walker's view (module docstring): ``uint8[SIZE, SIZE, 3]``."""
    if theme not in THEMES:
        raise ValueError(f"unknown theme {theme!r}; known: {', '.join(THEMES)}")
    th = THEMES[theme]
    angles = column_angles(pose.yaw)
    dist, face, kind, u = cast(maze, pose.x, pose.z, angles)
    horizon = SIZE / 2 + pose.pitch / DTHETA
    rows = np.arange(SIZE)[:, None] + 0.5
    height = FOCAL / np.maximum(dist, _EPS)
    top = horizon - height * (1 - EYE)
    bottom = horizon + height * EYE
    img = np.empty((SIZE, SIZE, 3))
    # floor and ceiling: distance of the plane at each row, a faint checker of the cells
    below = rows > horizon
    plane = np.where(below, FOCAL * EYE / np.maximum(rows - horizon, _EPS),
                     FOCAL * (1 - EYE) / np.maximum(horizon - rows, _EPS))
    px = pose.x + plane * np.cos(angles)[None, :]
    pz = pose.z + plane * np.sin(angles)[None, :]
    checker = 1.0 + _CHECKER * np.where((np.floor(px) + np.floor(pz)) % 2 == 0, 1.0, -1.0)
    base = np.where(below[..., None], np.asarray(th.floor), np.asarray(th.ceiling))
    img[:] = base * checker[..., None]
    depth = np.broadcast_to(plane, (SIZE, SIZE)).copy()
    # walls
    on_wall = (rows >= top) & (rows < bottom)
    v = np.clip(((rows - top) / height * TEX).astype(np.int64), 0, TEX - 1)
    tu = np.clip((u * TEX).astype(np.int64), 0, TEX - 1)
    texel = WALL_TEXTURES[kind[None, :], v, tu[None, :]] * np.asarray(th.tint)
    shade = np.where(face == 0, _FACE_SHADE[0], _FACE_SHADE[1])[None, :, None]
    img = np.where(on_wall[..., None], texel * shade, img)
    depth = np.where(on_wall, dist[None, :], depth)
    _draw_objects(img, depth, maze, pose, horizon, th.tint)
    fog = np.exp(-depth / th.fog_distance)[..., None]
    img = img * fog + np.asarray(th.fog) * (1 - fog)
    return np.clip(np.round(img * 255), 0, 255).astype(np.uint8)


def _draw_objects(img: np.ndarray, depth: np.ndarray, maze: Maze, pose: Pose, horizon: float,
                  tint: tuple[float, float, float]) -> None:
    cols = np.arange(SIZE) + 0.5
    rows = np.arange(SIZE)[:, None] + 0.5
    objs = sorted(maze.objects, key=lambda o: -((o.x - pose.x) ** 2 + (o.z - pose.z) ** 2))
    for o in objs:
        d = float(np.hypot(o.x - pose.x, o.z - pose.z))
        if d < 0.1:
            continue
        rel = (np.arctan2(o.z - pose.z, o.x - pose.x) - pose.yaw + np.pi) % (2 * np.pi) - np.pi
        centre = SIZE / 2 + rel / DTHETA
        half = FOCAL * OBJECT_WIDTH / d / 2
        if centre + half < 0 or centre - half > SIZE:
            continue
        bottom = horizon + FOCAL * EYE / d
        top = bottom - FOCAL * OBJECT_HEIGHT / d
        tu = ((cols - (centre - half)) / (2 * half) * TEX).astype(np.int64)
        tv = ((rows - top) / (bottom - top) * TEX).astype(np.int64)
        inside = (tu >= 0) & (tu < TEX) & (tv >= 0) & (tv < TEX)
        sprite = SPRITES[o.kind][np.clip(tv, 0, TEX - 1), np.clip(tu, 0, TEX - 1)]
        draw = inside & (sprite[..., 3] > 0.5) & (d < depth)
        img[draw] = sprite[..., :3][draw] * np.asarray(tint)
        depth[draw] = d

"""A PNG of frame strips: each row pair shows generated frames (top) above the renderer's (bottom)
for the same keys, with each frame's key under it. Used by ``eval.comparison_png`` and the demo."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class StripRow:
    """One row pair: ``generated`` and ``truth`` uint8 ``[N, H, W, 3]``, one key name per frame."""

    title: str
    generated: np.ndarray
    truth: np.ndarray
    keys: Sequence[str]


def strip_png(rows: Sequence[StripRow], path: Path, scale: int = 4) -> Path:
    """Draw ``rows`` (frames scaled ``scale`` times, nearest neighbour) into ``path``; returns it."""
    from PIL import Image, ImageDraw

    if not rows:
        raise ValueError("strip_png needs at least one row")
    for r in rows:
        if r.generated.shape != r.truth.shape or len(r.keys) != len(r.generated):
            raise ValueError(f"row {r.title!r}: generated {r.generated.shape}, truth {r.truth.shape} and "
                             f"{len(r.keys)} keys do not match")
    per_row = max(len(r.generated) for r in rows)
    size = rows[0].generated.shape[1] * scale
    label, title = 12, 14
    row_h = title + 2 * size + label + 10
    img = Image.new("RGB", (per_row * (size + 2), len(rows) * row_h), (255, 255, 255))
    draw = ImageDraw.Draw(img)
    for n, r in enumerate(rows):
        y = n * row_h
        draw.text((2, y + 1), f"{r.title} -- top: generated, bottom: renderer", fill=(0, 0, 0))
        for i in range(len(r.generated)):
            x = i * (size + 2)
            for j, frame in enumerate((r.generated[i], r.truth[i])):
                tile = Image.fromarray(frame).resize((size, size), Image.Resampling.NEAREST)
                img.paste(tile, (x, y + title + j * (size + 1)))
            draw.text((x + 2, y + title + 2 * size + 2), r.keys[i], fill=(0, 0, 0))
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path)
    return path

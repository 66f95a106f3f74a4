"""A chunk's frames as the one binary WebSocket message that follows its ``video.chunk_metadata``.

- ``png``: the frames' PNG files one after another (``frame_byte_lengths`` in the metadata says
  where each ends); a browser decodes each with ``createImageBitmap``.
- ``rgb``: the raw ``uint8 [F, H, W, 3]`` array, C order (the shape is in ``video.start``'s
  ``config``).

``frame_sha256`` is the sha256 of each frame's raw RGB bytes whatever the format, so a client can
compare a stream with offline output (``WorldRollout``) frame by frame.
"""

from __future__ import annotations

import hashlib
import io
from typing import NamedTuple

import numpy as np
from PIL import Image

FORMATS = ("png", "rgb")


class EncodedChunk(NamedTuple):
    payload: bytes
    frame_byte_lengths: list[int]
    frame_sha256: list[str]


def frame_sha256(frame: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(frame, dtype=np.uint8).tobytes()).hexdigest()


def encode_chunk(frames: np.ndarray, fmt: str) -> EncodedChunk:
    """``frames`` uint8 ``[F, H, W, 3]`` -> the chunk's binary message (see the module docstring)."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    frames = np.ascontiguousarray(frames, dtype=np.uint8)
    hashes = [frame_sha256(f) for f in frames]
    if fmt == "rgb":
        size = frames[0].nbytes
        return EncodedChunk(frames.tobytes(), [size] * len(frames), hashes)
    parts = []
    for frame in frames:
        buf = io.BytesIO()
        Image.fromarray(frame, "RGB").save(buf, format="PNG", compress_level=1)
        parts.append(buf.getvalue())
    return EncodedChunk(b"".join(parts), [len(p) for p in parts], hashes)


def decode_chunk(payload: bytes, frame_byte_lengths: list[int], fmt: str, shape: tuple[int, int, int]) -> np.ndarray:
    """The inverse of :func:`encode_chunk` (for clients and tests): uint8 ``[F, H, W, 3]``."""
    if fmt == "rgb":
        return np.frombuffer(payload, dtype=np.uint8).reshape(len(frame_byte_lengths), *shape).copy()
    out, pos = [], 0
    for n in frame_byte_lengths:
        out.append(np.asarray(Image.open(io.BytesIO(payload[pos:pos + n])).convert("RGB")))
        pos += n
    return np.stack(out)

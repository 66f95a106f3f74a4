"""R3 route rows on the wire, for every surface (OpenAI API, ``/v1/sessions``, ``/v1/realtime``):
base64 of the rows' full ``numpy.save`` bytes (docs/contracts.md 4)."""

from __future__ import annotations

import base64
import io

import numpy as np


def encode_routes(routes: np.ndarray | None) -> str | None:
    """``routes`` (``[tokens, layers, top_k]``) as base64 ``.npy`` text; ``None`` stays ``None``."""
    if routes is None:
        return None
    buf = io.BytesIO()
    np.save(buf, routes, allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode("ascii")

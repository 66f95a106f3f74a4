"""vLLM-Omni's ``camera`` modality (``multi_modal_data.camera``) -> a world session's camera event.

The payload is ``{"schema": "camera.v1", "mode": "target" | "velocity", "data": {...}}`` (schema
and mode default to ``camera.v1`` and ``target``, as vLLM-Omni's). ``data`` is vLLM-Omni's
structural pose (Unity axes: +X right, +Y up, +Z forward; a target relative to the session's start,
a velocity per frame): ``rotation`` a quaternion ``(x, y, z, w)`` and ``translation`` ``(x, y, z)``;
or, an extension, ``yaw`` and ``pitch`` in radians. Another extension: ``relative: true`` makes a
target relative to the pose it starts from ("turn by": what a mouse sends). The rotation becomes
yaw (turning right is positive) and pitch (looking up is positive) of its forward vector; its roll
is dropped. The walker moves by keys, through the world's physics, so a translation must be zero
(``unsupported_interaction_schema`` otherwise). ``transition_chunks`` (the interaction's) goes with
a target; ``at_frame`` is added by the handler from ``received_at``.
"""

from __future__ import annotations

import math
from typing import Any

from execstate.serve.realtime.errors import ProtocolError

SCHEMA = "camera.v1"


def _vector(value: Any, n: int, what: str, eid: str) -> list[float]:
    if (not isinstance(value, list) or len(value) != n
            or not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in value)):
        raise ProtocolError("invalid_message", f"camera {what} must be {n} finite numbers", eid)
    return [float(v) for v in value]


def yaw_pitch(q: list[float]) -> tuple[float, float]:
    """Yaw and pitch of the forward vector (+Z) rotated by the unit quaternion ``q = (x, y, z, w)``."""
    x, y, z, w = q
    n = math.sqrt(x * x + y * y + z * z + w * w)
    x, y, z, w = x / n, y / n, z / n, w / n
    fx = 2 * (x * z + w * y)
    fy = 2 * (y * z - w * x)
    fz = 1 - 2 * (x * x + y * y)
    return math.atan2(fx, fz), math.asin(max(-1.0, min(1.0, fy)))


def camera_data(camera: Any, transition_chunks: int | None, eid: str) -> dict[str, Any]:
    """The camera event's data (``session/world/camera.py``), or ``ProtocolError``."""
    if not isinstance(camera, dict) or set(camera) - {"schema", "mode", "data"}:
        raise ProtocolError("invalid_message", "a camera is {schema, mode, data}", eid)
    if camera.get("schema", SCHEMA) != SCHEMA:
        raise ProtocolError("unsupported_interaction_schema", f"the camera uses schema {SCHEMA!r}, got "
                            f"{camera.get('schema')!r}", eid)
    mode = camera.get("mode", "target")
    if mode not in ("target", "velocity"):
        raise ProtocolError("invalid_message", f"camera mode must be 'target' or 'velocity', got {mode!r}", eid)
    data = camera.get("data")
    if not isinstance(data, dict) or not data or set(data) - {"rotation", "translation", "yaw", "pitch", "relative"}:
        raise ProtocolError("invalid_message", "camera data is {rotation?, translation?} or {yaw?, pitch?}, and "
                            "relative? (a target)", eid)
    if "translation" in data and any(_vector(data["translation"], 3, "translation", eid)):
        raise ProtocolError("unsupported_interaction_schema", "this world moves the walker with keys (its physics "
                            "stops it at walls); a camera translation must be zero", eid)
    if "rotation" in data:
        if "yaw" in data or "pitch" in data:
            raise ProtocolError("invalid_message", "give the camera a rotation or yaw/pitch, not both", eid)
        q = _vector(data["rotation"], 4, "rotation", eid)
        if not any(q):
            raise ProtocolError("invalid_message", "camera rotation must be a non-zero quaternion", eid)
        yaw, pitch = yaw_pitch(q)
    else:
        yaw, pitch = (_vector([data.get(k, 0.0)], 1, k, eid)[0] for k in ("yaw", "pitch"))
    out: dict[str, Any] = {"mode": mode, "yaw": yaw, "pitch": pitch}
    if "relative" in data:
        if not isinstance(data["relative"], bool) or (data["relative"] and mode != "target"):
            raise ProtocolError("invalid_message", "camera relative is true or false, and true only for a target",
                                eid)
        if data["relative"]:
            out["relative"] = True
    if mode == "target" and transition_chunks is not None:
        out["transition_chunks"] = transition_chunks
    elif transition_chunks not in (None, 0):
        raise ProtocolError("unsupported_transition", "transition_chunks applies to a camera target", eid)
    return out

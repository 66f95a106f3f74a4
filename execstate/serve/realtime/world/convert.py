"""JSON <-> world-session values for the world WebSocket: ``session.create``'s checks, an
interaction's parts, the server events' bodies (no I/O; every refusal a ``ProtocolError``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from execstate.model.world.interface import WorldSpec
from execstate.serve.realtime.errors import ProtocolError
from execstate.serve.realtime.world.camera_schema import camera_data
from execstate.serve.realtime.world.encode import EncodedChunk
from execstate.serve.realtime.world.messages import MAX_PROMPT_CHARS, SessionCreate, SessionInteraction

MAX_FPS = 240.0
MIN_FPS = 1.0  # a positive rate below this would pace a chunk minutes apart (5e-324: forever)
MAX_SEED = 2**63 - 1
ACTION_SCHEMA = "keys.v1"


@dataclass(frozen=True)
class StartConfig:
    prompt: str
    seed: int
    fps: float  # 0: as fast as possible
    format: str
    start: str
    num_frames: int | None
    window_chunks: int | None


def fps_problem(fps: float) -> str | None:
    """Why ``fps`` is not a frame rate a session may ask for (0: as fast as possible, else
    ``MIN_FPS`` to ``MAX_FPS``), or ``None``."""
    if fps == 0 or MIN_FPS <= fps <= MAX_FPS:
        return None
    return f"fps must be 0 (as fast as possible) or in [{MIN_FPS:g}, {MAX_FPS:g}], got {fps}"


def start_config(msg: SessionCreate, spec: WorldSpec, model_name: str, default_fps: float,
                 max_frames: int) -> StartConfig:
    """``session.create``'s fields checked against the model (vLLM-Omni's fields must agree with it)
    and the server's bounds (``fps``: :func:`fps_problem`; ``num_frames``: 1 to ``max_frames``)."""
    eid = msg.event_id

    def bad(text: str) -> ProtocolError:
        return ProtocolError("invalid_message", f"session.create: {text}", eid)

    fps = default_fps if msg.fps is None else msg.fps
    if (problem := fps_problem(fps)) is not None:
        raise bad(problem)
    if not 0 <= msg.seed <= MAX_SEED:
        raise bad(f"seed must be in [0, 2**63), got {msg.seed}")
    check_prompt(msg.prompt, eid, allow_empty=True)
    if msg.num_frames is not None and not 1 <= msg.num_frames <= max_frames:
        raise bad(f"num_frames must be in [1, {max_frames}] (--world-max-frames), got {msg.num_frames}")
    if msg.model is not None and msg.model != model_name:
        raise ProtocolError("model_not_found", f"this server serves the world model {model_name!r}, "
                                 f"not {msg.model!r}", eid)
    h, w, _ = spec.frame_shape
    if (msg.width is not None and msg.width != w) or (msg.height is not None and msg.height != h):
        raise bad(f"this model makes {w}x{h} frames, got width={msg.width} height={msg.height}")
    if msg.num_inference_steps is not None and msg.num_inference_steps != len(spec.schedule):
        raise bad(f"this model denoises in {len(spec.schedule)} steps, got num_inference_steps="
                  f"{msg.num_inference_steps}")
    if msg.guidance_scale is not None and msg.guidance_scale != 1.0:
        raise bad(f"this model has no classifier-free guidance (guidance_scale 1.0), got {msg.guidance_scale}")
    if msg.negative_prompt:
        raise bad("this model has no negative prompt")
    if msg.extra_params:
        raise bad(f"unknown extra_params {sorted(msg.extra_params)}; this model takes none")
    if msg.window_chunks is not None and not 1 <= msg.window_chunks <= spec.max_window_chunks:
        raise bad(f"window_chunks must be in [1, {spec.max_window_chunks}], got {msg.window_chunks}")
    return StartConfig(msg.prompt, msg.seed, float(fps), msg.format, msg.start, msg.num_frames, msg.window_chunks)


def camera_config(spec: WorldSpec) -> dict[str, Any]:
    """``video.start``'s description of the world's camera (empty for a world without one)."""
    if spec.camera is None:
        return {"world": spec.world}
    return {"world": spec.world, "camera": {
        "schema": "camera.v1", "modes": ["target", "velocity"], "units": "radians, session-relative",
        "turn_keys": {k: round(v, 6) for k, v in spec.camera.turn_keys},
        "pitch_limit": round(spec.camera.pitch_limit, 6)}}


def check_prompt(prompt: Any, event_id: Any, allow_empty: bool = False) -> str:
    if not isinstance(prompt, str) or (not allow_empty and not prompt.strip()):
        raise ProtocolError("invalid_message", "a prompt must be a non-empty string", event_id)
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ProtocolError("invalid_message", f"a prompt is at most {MAX_PROMPT_CHARS} characters, got "
                                 f"{len(prompt)}", event_id)
    return prompt


@dataclass(frozen=True)
class InteractionParts:
    event_id: str
    keys: list[str] | None
    prompt: str | None
    camera: dict[str, Any] | None = None  # a camera event's data, but its at_frame (``session/world/camera.py``)


def interaction_parts(msg: SessionInteraction, spec: WorldSpec, generated_id: str) -> InteractionParts:
    """vLLM-Omni's ``interaction`` -> the event's id, the held keys (an action) and the prompt."""
    it = msg.interaction
    given = it.event_id if it.event_id is not None else it.interaction_id
    if it.event_id is not None and it.interaction_id is not None and it.event_id != it.interaction_id:
        raise ProtocolError("invalid_message", "interaction: event_id and interaction_id differ", msg.event_id)
    if given is not None and not 0 < len(given) <= 128:
        raise ProtocolError("invalid_message", "interaction: event_id must be 1-128 characters", msg.event_id)
    eid = given if given is not None else (str(msg.event_id) if msg.event_id is not None else generated_id)
    event = it.event
    unknown = set(event) - {"prompt", "multi_modal_data", "negative_prompt"}
    if unknown:
        raise ProtocolError("invalid_message", f"interaction.event: unknown field(s) {sorted(unknown)}", eid)
    if event.get("negative_prompt") is not None:
        raise ProtocolError("unsupported_interaction_schema", "this model has no negative prompt", eid)
    prompt = None if event.get("prompt") is None else check_prompt(event["prompt"], eid)
    mm = event.get("multi_modal_data") or {}
    if not isinstance(mm, dict):
        raise ProtocolError("invalid_message", "interaction.event.multi_modal_data must be an object", eid)
    for name in mm:
        if name == "camera" and spec.camera is None:
            raise ProtocolError("unsupported_interaction_schema", "this world has no camera (a fixed top-down "
                                     "view); steer it with actions", eid)
        if name not in ("action", "camera"):
            raise ProtocolError("unsupported_interaction_schema", f"unsupported modality {name!r}", eid)
    keys = _action_keys(mm["action"], eid) if "action" in mm else None
    camera = camera_data(mm["camera"], it.transition_chunks, eid) if "camera" in mm else None
    if it.transition_chunks not in (None, 0) and (camera is None or camera["mode"] != "target"):
        raise ProtocolError("unsupported_transition", "prompts and actions change at the next chunk boundary; "
                            f"transition_chunks (got {it.transition_chunks}) applies to a camera target", eid)
    if keys is None and prompt is None and camera is None:
        raise ProtocolError("invalid_message", "an interaction needs event.prompt, an action or a camera", eid)
    return InteractionParts(eid, keys, prompt, camera)


def _action_keys(action: Any, eid: str) -> list[str]:
    if not isinstance(action, dict) or set(action) - {"schema", "mode", "data"}:
        raise ProtocolError("invalid_message", "an action is {schema, mode, data}", eid)
    if action.get("schema", ACTION_SCHEMA) != ACTION_SCHEMA:
        raise ProtocolError("unsupported_interaction_schema", f"actions use schema {ACTION_SCHEMA!r}, got "
                                 f"{action.get('schema')!r}", eid)
    if action.get("mode", "velocity") != "velocity":
        raise ProtocolError("unsupported_interaction_schema", "a key action is a velocity (held until "
                                 f"released or replaced), got mode {action.get('mode')!r}", eid)
    data = action.get("data")
    keys = data.get("keys") if isinstance(data, dict) and set(data) == {"keys"} else None
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise ProtocolError("invalid_message", "an action's data is {\"keys\": [key names]}", eid)
    return keys


def chunk_metadata(request_id: str, transport_index: int, generation_index: int, spec: WorldSpec,
                   keys: tuple[str, ...], events: dict[str, list[str]], prompt: str | None, prompt_version: int,
                   enc: EncodedChunk, timings: dict[str, float], behind_ms: float | None, fmt: str,
                   camera: tuple[tuple[float, float], ...] | None = None) -> dict[str, Any]:
    """``video.chunk_metadata`` (vLLM-Omni's fields, then ours): it precedes the chunk's binary frame.
    ``camera``: each frame's pose (yaw, pitch; session-relative radians) for a world with a camera."""
    f = spec.frames_per_chunk
    extra = {} if camera is None else {"camera": [{"yaw": round(y, 6), "pitch": round(p, 6)} for y, p in camera]}
    return {
        "type": "video.chunk_metadata", "request_id": request_id, "kind": "media",
        "transport_chunk_index": transport_index, "generation_chunk_index": generation_index, "num_frames": f,
        "byte_length": len(enc.payload), "started_event_ids": events["started"],
        "active_event_ids": events["active"], "completed_event_ids": events["completed"],
        "format": fmt, "frame_indices": list(range(generation_index * f, (generation_index + 1) * f)),
        "frame_byte_lengths": enc.frame_byte_lengths, "frame_sha256": enc.frame_sha256,
        "keys": list(keys), "prompt": prompt, "prompt_version": prompt_version,
        "timings": {k: round(v, 3) for k, v in timings.items()},
        "behind_ms": None if behind_ms is None else round(behind_ms, 3), **extra,
    }

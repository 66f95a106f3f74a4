"""Deprecated path: moved to ``execstate.session.world.offline`` (issue 18); this shim goes in the next release."""

from execstate.session._moved import moved
from execstate.session.world.offline import (  # noqa: F401
    Checkpoint,
    SessionEventError,
    World,
    WorldSession,
    WorldStepResult,
    load_world_model,
    scene_frames,
)

__all__ = [
    "Checkpoint",
    "SessionEventError",
    "World",
    "WorldSession",
    "WorldStepResult",
    "load_world_model",
    "scene_frames",
]

moved("execstate.session.world_offline", "execstate.session.world.offline")

"""Deprecated path: moved to ``execstate.session.world.events`` (issue 18); this shim goes in the next release."""

from execstate.session._moved import moved
from execstate.session.world.events import (  # noqa: F401
    ACTION,
    CAMERA,
    KEY,
    MAX_PROMPT_CHARS,
    PROMPT,
    ChunkControls,
    HeldKey,
    apply_boundary,
    world_event_kinds,
)

__all__ = [
    "ACTION",
    "CAMERA",
    "ChunkControls",
    "HeldKey",
    "KEY",
    "MAX_PROMPT_CHARS",
    "PROMPT",
    "apply_boundary",
    "world_event_kinds",
]

moved("execstate.session.world_events", "execstate.session.world.events")

"""Deprecated path: moved to ``execstate.session.world.step`` (issue 18); this shim goes in the next release."""

from execstate.session._moved import moved
from execstate.session.world.step import (  # noqa: F401
    ComputedStep,
    PreparedStep,
    WorldStepResult,
    compute_world_step,
    finish_world_step,
    prepare_world_step,
)

__all__ = [
    "ComputedStep",
    "PreparedStep",
    "WorldStepResult",
    "compute_world_step",
    "finish_world_step",
    "prepare_world_step",
]

moved("execstate.session.world_step", "execstate.session.world.step")

"""Deprecated path: moved to ``execstate.session.lm.step`` (issue 18); this shim goes in the next release."""

from execstate.session._moved import moved
from execstate.session.lm.step import (  # noqa: F401
    StepDelta,
    StepHandle,
    StepResult,
    finish_lm_step,
    start_lm_step,
)

__all__ = ['StepDelta', 'StepHandle', 'StepResult', 'finish_lm_step', 'start_lm_step']

moved("execstate.session.lm_step", "execstate.session.lm.step")

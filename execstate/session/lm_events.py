"""Deprecated path: moved to ``execstate.session.lm.events`` (issue 18); this shim goes in the next release."""

from execstate.session._moved import moved
from execstate.session.lm.events import (  # noqa: F401
    INPUT,
    SAMPLING,
    SAMPLING_FIELDS,
    lm_event_kinds,
    pretokenize,
)

__all__ = ['INPUT', 'SAMPLING', 'SAMPLING_FIELDS', 'lm_event_kinds', 'pretokenize']

moved("execstate.session.lm_events", "execstate.session.lm.events")

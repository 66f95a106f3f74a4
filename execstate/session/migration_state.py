"""Deprecated path: moved to ``execstate.session.lm.migration_state`` (issue 18); this shim goes in the next release."""

from execstate.session._moved import moved
from execstate.session.lm.migration_state import (  # noqa: F401
    build_offer,
    check_offer,
    event_queue,
    rng_state,
    route_rows,
    sampling_params,
)

__all__ = ['build_offer', 'check_offer', 'event_queue', 'rng_state', 'route_rows', 'sampling_params']

moved("execstate.session.migration_state", "execstate.session.lm.migration_state")

"""Deprecated path: moved to ``execstate.session.lm.migration_source`` (issue 18); this shim goes in the next
release."""

from execstate.session._moved import moved
from execstate.session.lm.migration_source import (  # noqa: F401
    Outgoing,
    begin_export,
    chain_keys_from,
    finish_export,
)

__all__ = ['Outgoing', 'begin_export', 'chain_keys_from', 'finish_export']

moved("execstate.session.migration_source", "execstate.session.lm.migration_source")

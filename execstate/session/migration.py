"""Deprecated path: moved to ``execstate.session.lm.migration`` (issue 18); this shim goes in the next release."""

from execstate.session._moved import moved
from execstate.session.lm.migration import (  # noqa: F401
    Migrated,
    migrate_session,
    wait_import,
)

__all__ = ['Migrated', 'migrate_session', 'wait_import']

moved("execstate.session.migration", "execstate.session.lm.migration")

"""Deprecated path: moved to ``execstate.session.lm.migration_target`` (issue 18); this shim goes in the next
release."""

from execstate.session._moved import moved
from execstate.session.lm.migration_target import (  # noqa: F401
    ImportHandle,
    MigrationResult,
    begin_import,
)

__all__ = ['ImportHandle', 'MigrationResult', 'begin_import']

moved("execstate.session.migration_target", "execstate.session.lm.migration_target")

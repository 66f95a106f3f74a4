"""Deprecated path: moved to ``execstate.session.world.migration`` (issue 18); this shim goes in the next release."""

from execstate.session._moved import moved
from execstate.session.world.migration import (  # noqa: F401
    export_world_session,
    finish_export,
    import_world_session,
    migrate_world_session,
)

__all__ = ['export_world_session', 'finish_export', 'import_world_session', 'migrate_world_session']

moved("execstate.session.world_migration", "execstate.session.world.migration")

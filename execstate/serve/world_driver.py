"""Deprecated shim: ``execstate.serve.world_driver`` moved to
``execstate.serve.realtime.world.host`` (this path works for one release)."""

import warnings

from execstate.serve.realtime.world.host import *  # noqa: F403

warnings.warn("execstate.serve.world_driver moved to execstate.serve.realtime.world.host", DeprecationWarning,
              stacklevel=2)

"""Deprecated shim: ``execstate.serve.world_encode`` moved to
``execstate.serve.realtime.world.encode`` (this path works for one release)."""

import warnings

from execstate.serve.realtime.world.encode import *  # noqa: F403

warnings.warn("execstate.serve.world_encode moved to execstate.serve.realtime.world.encode", DeprecationWarning,
              stacklevel=2)

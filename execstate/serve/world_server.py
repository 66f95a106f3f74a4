"""Deprecated shim: ``execstate.serve.world_server`` moved to
``execstate.serve.realtime.world.app`` (this path works for one release)."""

import warnings

from execstate.serve.realtime.world.app import *  # noqa: F403
from execstate.serve.realtime.world.app import world_model_from_option as load_world_model  # noqa: F401

warnings.warn("execstate.serve.world_server moved to execstate.serve.realtime.world.app", DeprecationWarning,
              stacklevel=2)

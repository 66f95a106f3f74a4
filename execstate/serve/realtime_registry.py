"""Deprecated shim: ``execstate.serve.realtime_registry`` moved to
``execstate.serve.realtime.lm.owners`` (this path works for one release)."""

import warnings

from execstate.serve.realtime.lm.owners import *  # noqa: F403

warnings.warn("execstate.serve.realtime_registry moved to execstate.serve.realtime.lm.owners", DeprecationWarning,
              stacklevel=2)

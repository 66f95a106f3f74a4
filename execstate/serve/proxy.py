"""Deprecated shim: ``execstate.serve.proxy`` moved to
``execstate.serve.pd.proxy`` (this path works for one release)."""

import warnings

from execstate.serve.pd.proxy import *  # noqa: F403

warnings.warn("execstate.serve.proxy moved to execstate.serve.pd.proxy", DeprecationWarning,
              stacklevel=2)

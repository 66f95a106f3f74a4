"""Deprecated shim: ``execstate.serve.kv_transfer_config`` moved to
``execstate.serve.pd.kv_transfer_config`` (this path works for one release)."""

import warnings

from execstate.serve.pd.kv_transfer_config import *  # noqa: F403

warnings.warn("execstate.serve.kv_transfer_config moved to execstate.serve.pd.kv_transfer_config", DeprecationWarning,
              stacklevel=2)

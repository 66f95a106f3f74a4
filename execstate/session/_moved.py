"""The deprecation notice of the session modules that moved (issue 18): each old module path
(``execstate.session.lm_sessions``, ...) is a shim that re-exports its names from the new path
and calls :func:`moved` once, at import. The shims go in the next release."""

from __future__ import annotations

import warnings


def moved(old: str, new: str) -> None:
    """Warn (``DeprecationWarning``, attributed to the shim's importer) that ``old`` is now ``new``."""
    warnings.warn(f"{old} is deprecated: import from {new} (the old path will be removed in the next release)",
                  DeprecationWarning, stacklevel=3)

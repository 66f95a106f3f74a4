"""Where execstate keeps files it builds (embedded models, ...).

``cache_dir()`` is ``$EXECSTATE_CACHE`` if set, else ``$XDG_CACHE_HOME/execstate``, else
``~/.cache/execstate``. Embedded models live at ``cache_dir()/models/NAME``.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Root of execstate's user cache (not created here)."""
    env = os.environ.get("EXECSTATE_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg).expanduser() / "execstate"
    return Path.home() / ".cache" / "execstate"


def models_dir() -> Path:
    """Directory holding one sub-directory per prepared embedded model."""
    return cache_dir() / "models"


def model_dir(name: str) -> Path:
    """Final location of the embedded model ``name``."""
    return models_dir() / name

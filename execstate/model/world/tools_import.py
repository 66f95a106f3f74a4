"""Where the runtime finds the world models' training and evaluation tools.

They are not part of the runtime package (the wheel ships the models, their renderers and what a
session needs, not the trainers): they live in the source repository's ``tools/world``. The runtime
reaches them only where a command needs them (``execstate world ...``, ``execstate models prepare
world``, ``execstate bench world``'s quality part): :func:`world_tool` imports ``tools.world.<name>``,
from ``sys.path`` or else from the checkout the package was installed from (an editable install),
and says what to do when neither has them.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

CHECKOUT = Path(__file__).resolve().parents[3]  # execstate/model/world/ -> the repository root


class WorldToolsMissing(ImportError):
    """The world tools are not installed here (a wheel install, not a source checkout)."""


def world_tool(name: str) -> ModuleType:
    """``tools.world.<name>`` (module docstring); :class:`WorldToolsMissing` when there is none."""
    try:
        return importlib.import_module(f"tools.world.{name}")
    except ModuleNotFoundError as e:
        if e.name not in ("tools", "tools.world"):
            raise
    if (CHECKOUT / "tools" / "world" / "__init__.py").is_file() and str(CHECKOUT) not in sys.path:
        sys.path.append(str(CHECKOUT))
        return importlib.import_module(f"tools.world.{name}")
    raise WorldToolsMissing(f"the world-model tools (tools/world/{name}.py) come with execstate's source "
                            "repository, not with the package: run this from a checkout "
                            "(git clone; make setup)")

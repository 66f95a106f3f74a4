"""Where the runtime finds the world models' training tools: the entry-point group ``execstate.world_tools``.

They are not part of the runtime package (the wheel ships the models, their renderers and what a
session needs, not the trainers): they are ``execstate_bench.world_tools``, in the benchmarks'
distribution of the source repository (``benchmarks/``), which registers under :data:`GROUP` each
tool module the runtime reaches by name (``train``, for ``execstate models prepare world``; the
``execstate world`` command itself is registered in ``execstate.commands``,
``execstate/commands.py``). :func:`world_tool` loads one, and says what to do when it is not
installed. Nothing here touches ``sys.path``.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from types import ModuleType

GROUP = "execstate.world_tools"


class WorldToolsMissing(ImportError):
    """The world tools are not installed here (a wheel install, not a source checkout's ``make setup``)."""


def world_tool(name: str) -> ModuleType:
    """The world tool module registered as ``name`` (module docstring); :class:`WorldToolsMissing`
    when none is."""
    for ep in entry_points(group=GROUP, name=name):
        module: ModuleType = ep.load()
        return module
    raise WorldToolsMissing(f"the world-model tools ({name}) come with execstate's source repository, not with the "
                            "package: they are the benchmarks' distribution execstate-bench (benchmarks/); from a "
                            "checkout, `make setup` installs it (or: pip install -e benchmarks)")

"""Commands that other distributions add to ``execstate``: the entry-point group ``execstate.commands``.

The runtime's wheel holds the runtime only. A distribution that adds a command (``execstate-bench``,
the repository's ``benchmarks/``, adds ``bench`` and ``world``) registers it under the group
:data:`GROUP`: the entry point's name is the command, its value a callable ``add(subparsers)``
that adds the command's parser to ``execstate``'s sub-parsers and sets its ``func`` default
(``func(args)`` returns the exit status), as the built-in commands do. The built-in commands come
first: a registered command cannot replace one (it is ignored, with a line on stderr).

A command that execstate expects from such a distribution (:data:`EXPECTED`) but that is not
installed still parses: it prints one line saying how to get it and exits with status 2. So does a
registered command whose distribution fails to load (a broken install), naming the error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from importlib.metadata import entry_points

GROUP = "execstate.commands"

# The commands the repository's own distributions add, and how to get each where it is missing.
_HOW = ("they are the distribution execstate-bench in execstate's source repository (benchmarks/); from a checkout, "
        "`make setup` installs it (or: pip install -e benchmarks)")
EXPECTED = {
    "bench": ("benchmarks", f"the benchmarks are not installed here: {_HOW}"),
    "world": ("world-model training and evaluation", f"the world models' tools are not installed here: {_HOW}"),
}


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add every registered command to ``sub``, and a placeholder for each expected one that is missing."""
    taken = set(sub.choices)
    for ep in sorted(entry_points(group=GROUP), key=lambda e: e.name):
        if ep.name in taken:
            print(f"execstate: the command {ep.name!r} of {ep.value} is ignored: the name is taken",
                  file=sys.stderr)
            continue
        try:
            add: Callable[[argparse._SubParsersAction], None] = ep.load()
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not break every other command
            _placeholder(sub, ep.name, "command", f"its distribution is installed but fails to load ({ep.value}: "
                                                  f"{type(exc).__name__}: {exc})")
            taken.add(ep.name)
            continue
        add(sub)
        taken.add(ep.name)
    for name, (help_text, message) in EXPECTED.items():
        if name not in taken:
            _placeholder(sub, name, f"{help_text} (not installed)", message)


def _placeholder(sub: argparse._SubParsersAction, name: str, help_text: str, message: str) -> None:
    """``execstate NAME ...``: one line on stderr and status 2, whatever follows."""
    p = sub.add_parser(name, help=help_text, description=f"execstate {name}: {message}")
    p.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    def missing(_args: argparse.Namespace) -> int:
        print(f"execstate {name}: {message}", file=sys.stderr)
        return 2

    p.set_defaults(func=missing)

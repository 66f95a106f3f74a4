"""How long the bench process's OpenMP threads spin before they sleep: about as long as vLLM's.

The in-process peers (the engines, transformers) run on libgomp's team, torch's. A libgomp thread
that waits (for the next parallel region, at a barrier) spins ``GOMP_SPINCOUNT`` times and then
sleeps on a futex, and the region that needs it again pays its wake-up. libgomp's default spin is
300,000 (~7 ms on the bench VM: the process's CPU time over an idle second after a prefill).
vLLM's CPU build runs on Intel's OpenMP, whose threads spin ``KMP_BLOCKTIME`` = 200 ms by default. ``set_spin`` gives
the bench's own peers a spin of the same order (``SPIN_COUNT``: ~70 ms idle on the bench VM), so
the side-by-side compares both runtimes at their spinning settings. A spin that long never
reaches the next peer's timed run: ``machine.settle`` pauses 0.5 s before each.

libgomp reads the variable once, when it loads (with torch), so ``set_spin`` must run before
torch is imported; a value already in the environment is kept (the user's choice).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping

ENV = "GOMP_SPINCOUNT"
SPIN_COUNT = "3000000"


def set_spin(environ: MutableMapping[str, str] = os.environ, modules: Mapping[str, object] = sys.modules) -> str | None:
    """Set ``GOMP_SPINCOUNT`` to ``SPIN_COUNT`` unless it is set. Returns the value libgomp uses:
    the one in the environment, or ``None`` (libgomp's default; the environment is left as it is)
    when torch, and with it libgomp, was imported before and the variable was not set."""
    if ENV in environ:
        return environ[ENV]
    if "torch" in modules:
        return None
    environ[ENV] = SPIN_COUNT
    return SPIN_COUNT

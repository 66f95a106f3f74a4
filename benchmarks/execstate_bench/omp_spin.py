"""The bench process's OpenMP spin: its threads wait spinning ~70 ms before they sleep.

The in-process peers (the engines, transformers) run on libgomp's team, torch's. A libgomp thread
that waits (for the next parallel region, at a barrier) spins ``GOMP_SPINCOUNT`` times and then
sleeps on a futex; the region that needs it again wakes it, and on the bench VM a halted vCPU is
woken too. libgomp's default spin is 300,000 (~7 ms on the bench VM: the process's CPU time over
an idle second after a prefill); ``SPIN_COUNT`` spins ~70 ms. In one process, 8 x 256-token fp32
prefills of the standard MoE ran ~2-4 % faster with it (docs/performance.md 16.14). vLLM's peer
keeps its own settings (its CPU worker sets Intel OpenMP's ``KMP_BLOCKTIME=5`` ms and binds its
threads to the first CPUs). A spin this long never reaches the next peer's timed run:
``machine.settle`` pauses 0.5 s before each. The engine's default elsewhere is libgomp's.

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

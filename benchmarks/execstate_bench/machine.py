"""What the benchmarks record about the machine they ran on (noise context for a report)."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path


def loadavg() -> tuple[float, float, float] | None:
    """The 1, 5 and 15 minute load averages, or ``None`` where the platform has none."""
    return os.getloadavg() if hasattr(os, "getloadavg") else None


def loadavg_1m() -> float:
    """The 1-minute load average (taken before each timed run), NaN where the platform has none."""
    la = loadavg()
    return la[0] if la is not None else float("nan")


def cpu_name() -> str | None:
    """The CPU model name from /proc/cpuinfo, else ``platform.processor()``, else ``None``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


SETTLE_S = 0.5


def settle() -> None:
    """Pause before a timed run: OpenMP runtimes keep their threads spinning for a while after a
    parallel region (libiomp5's KMP_BLOCKTIME is 200 ms; vLLM's CPU build runs on it), so a run
    that starts right after another peer's would share the cores with those threads. Measured:
    the standard model's batch-8 prefill right after a vLLM run 3.9k tok/s, alone 5.7-6.1k."""
    time.sleep(SETTLE_S)

"""What the benchmarks record about the machine they ran on (noise context for a report)."""

from __future__ import annotations

import os
import platform
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

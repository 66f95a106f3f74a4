"""What the benchmarks record about the machine they ran on (noise context for a report)."""

from __future__ import annotations

import math
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


def cpu_jiffies() -> tuple[int, int, int] | None:
    """The machine's CPU time so far from /proc/stat's ``cpu`` line, in clock ticks over all CPUs:
    (total, busy, steal); busy counts every state but idle, iowait and steal (user, nice, system,
    irq, softirq; guest time is already inside user). ``None`` where there is no /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    if len(fields) < 8:
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    return sum(fields), user + nice + system + irq + softirq, steal


def machine_shares(before: tuple[int, int, int] | None, after: tuple[int, int, int] | None) -> tuple[float, float]:
    """(busy share, steal share) of the machine's CPU time between two ``cpu_jiffies`` readings:
    busy = every process's CPU time / all CPUs' time, steal = time the hypervisor ran something
    else on this VM's CPUs / all CPUs' time. A slow run at a full CPU share of its own with a
    high steal share was the host's, not the run's. NaN where unknown or no tick passed."""
    if before is None or after is None or after[0] <= before[0]:
        return float("nan"), float("nan")
    total = after[0] - before[0]
    return (after[1] - before[1]) / total, (after[2] - before[2]) / total


SETTLE_S = 0.5
QUIET_MAX_S = 2.0  # the longest ``settle(until_quiet=True)`` waits past SETTLE_S
QUIET_WINDOW_S = 0.1
QUIET_OTHERS_CPUS = 0.3  # other processes' CPU time per second below which the machine is quiet


def others_share(before: tuple[int, int, int] | None, after: tuple[int, int, int] | None, own_cpu_s: float,
                 wall_s: float) -> float:
    """The other processes' CPU time between two ``cpu_jiffies`` readings ``wall_s`` apart, as a
    share of all CPUs' time: the machine's busy share (``machine_shares``) less this process's
    own ``own_cpu_s`` over ``wall_s`` x the CPUs. NaN where unknown."""
    busy, _ = machine_shares(before, after)
    return busy - own_cpu_s / (wall_s * (os.cpu_count() or 1))


def others_cpus(window_s: float = QUIET_WINDOW_S) -> float:
    """CPUs' worth of work that processes other than this one did over the next ``window_s``
    seconds (``others_share`` in CPUs): a thread spinning on a CPU shows as ~1. NaN where there
    is no /proc/stat."""
    j0, cpu0 = cpu_jiffies(), time.process_time()
    time.sleep(window_s)
    return others_share(j0, cpu_jiffies(), time.process_time() - cpu0, window_s) * (os.cpu_count() or 1)


def settle(until_quiet: bool = False) -> float:
    """Pause before a timed run: OpenMP runtimes keep their threads spinning for a while after a
    parallel region (libiomp5's KMP_BLOCKTIME is 200 ms; vLLM's CPU build runs on it), so a run
    that starts right after another peer's would share the cores with those threads. Measured:
    the standard model's batch-8 prefill right after a vLLM run 3.9k tok/s, alone 5.7-6.1k.
    ``until_quiet``: then wait on, in ``QUIET_WINDOW_S`` windows and at most ``QUIET_MAX_S``,
    until the other processes use less than ``QUIET_OTHERS_CPUS`` CPUs (measured on the 2-CPU
    VM: for at least 0.5 s after each of vLLM's runs one CPU's worth of vLLM's work went on,
    and into the next peer's run: an 8 x 256 fp32 prefill of the standard MoE took 400-505 ms
    beside it against 309-334 ms). Returns the seconds waited."""
    t0 = time.perf_counter()
    time.sleep(SETTLE_S)
    if until_quiet:
        deadline = time.perf_counter() + QUIET_MAX_S
        while time.perf_counter() < deadline:
            others = others_cpus()
            if math.isnan(others) or others < QUIET_OTHERS_CPUS:
                break
    return time.perf_counter() - t0

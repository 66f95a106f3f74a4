"""The machine's CPU accounting the throughput bench records per timed run (``machine.py``):
the host's steal and the other processes' CPU time, as shares of all CPUs' time."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from execstate_bench.machine import QUIET_MAX_S, SETTLE_S, cpu_jiffies, machine_shares, others_cpus, settle


def test_machine_shares_from_two_readings() -> None:
    # 400 ticks over all CPUs: 250 busy, 60 stolen by the hypervisor
    busy, steal = machine_shares((1000, 600, 10), (1400, 850, 70))
    assert busy == pytest.approx(250 / 400)
    assert steal == pytest.approx(60 / 400)


def test_machine_shares_unknown_or_no_tick() -> None:
    for before, after in ((None, (1, 1, 0)), ((1, 1, 0), None), ((5, 2, 0), (5, 3, 0))):
        assert all(math.isnan(x) for x in machine_shares(before, after))


@pytest.mark.skipif(not Path("/proc/stat").is_file(), reason="needs Linux /proc/stat")
def test_cpu_jiffies_counts_this_process_busy() -> None:
    before = cpu_jiffies()
    assert before is not None
    total, busy, steal = before
    assert 0 <= steal <= total and 0 < busy < total
    t_end = time.process_time() + 0.3  # 0.3 CPU s of our own: at least 30 ticks at 100 Hz
    while time.process_time() < t_end:
        pass
    after = cpu_jiffies()
    assert after is not None
    hz = os.sysconf("SC_CLK_TCK")
    assert after[1] - busy >= 0.2 * hz  # the busy loop shows as busy time (a little slack for tick sampling)
    share, _ = machine_shares(before, after)
    assert 0 < share <= 1


@pytest.mark.skipif(not Path("/proc/stat").is_file(), reason="needs Linux /proc/stat")
def test_settle_waits_for_another_process_to_stop() -> None:
    # a process spinning on a CPU for 1.2 s, as a peer's leftover threads do after its run
    spin = "import time\nt = time.time() + 1.2\nwhile time.time() < t:\n    pass\n"
    child = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(0.15)  # started and spinning
        assert others_cpus(0.2) > 0.5  # one CPU's worth of someone else's work
        waited = settle(until_quiet=True)
    finally:
        child.wait()
    assert 0.8 <= waited <= SETTLE_S + QUIET_MAX_S + 0.3  # the spinner's remaining ~1.05 s, not only SETTLE_S
    assert settle() == pytest.approx(SETTLE_S, abs=0.1)  # without until_quiet: the fixed pause

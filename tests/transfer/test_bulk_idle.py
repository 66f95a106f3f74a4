"""An idle NIXL agent must not burn a core (the wrapper's progress thread busy-polls by default)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import time, torch
from execstate.state.kv_pool import KVPool
from execstate.transfer.bulk import NixlBulk
bulk = NixlBulk(KVPool(2, 8, 4, 2, 8, torch.float32), "idle-probe")
time.sleep(0.3)
t0 = time.process_time()
time.sleep(1.0)
print(time.process_time() - t0)
bulk.close()
"""


def test_idle_agent_does_not_spin():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    cpu = float(out.stdout.strip().splitlines()[-1])
    assert cpu < 0.3, f"idle NIXL agent used {cpu:.2f} CPU-s per second"

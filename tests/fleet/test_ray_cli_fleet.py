"""``execstate serve MODEL --ray --replicas 3`` on this machine, end to end (slow: a real local Ray
cluster, three engine replicas).

Before: the CLI's cluster had 2 CPUs and each replica reserved one, so the third was never
scheduled, the ready line never came, and a replica SIGKILLed meanwhile made ``serve.run`` raise:
the process exited with status 1 and its ingress with it. The cluster's processes listened on the
machine's address and on wildcard addresses.

Now: the replicas get a share of the CPUs and all three deploy; a replica SIGKILLed while the fleet
deploys does not end the process, the ready line comes, the fleet answers and the three replicas
register again; every TCP socket the cluster's processes listen on is on loopback.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from execstate.fleet.cluster_plan import LOCAL_ONLY_ENV
from execstate.model.random_models import make_random
from execstate.model.random_tokenizer import write_tokenizer

pytest.importorskip("ray")
READY = "execstate fleet: 3 replicas"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pid: int) -> set[int]:
    parents: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parents[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
    out, todo = {pid}, [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parents.items() if pp == p and c not in out]
        out.update(kids)
        todo += kids
    return out


def listening_addresses(pids: set[int]) -> dict[str, set[str]]:
    """The local addresses of the TCP sockets in LISTEN state that ``pids`` hold (Linux /proc), with
    the names of the processes holding each."""
    by_inode: dict[str, str] = {}
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                f = line.split()
                if len(f) > 9 and f[3] == "0A":
                    hexaddr = f[1].split(":")[0]
                    by_inode[f"socket:[{f[9]}]"] = _address(hexaddr, width)
    found: dict[str, set[str]] = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            name = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:80].decode(errors="replace")
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link in by_inode:
                        found.setdefault(by_inode[link], set()).add(name)
    return found


def _address(hexaddr: str, width: int) -> str:
    raw = bytes.fromhex(hexaddr)
    if width == 8:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)


def loopback(address: str) -> bool:
    return address in ("127.0.0.1", "::1", "::ffff:127.0.0.1")


@pytest.mark.slow
def test_three_replicas_deploy_survive_a_kill_and_listen_on_loopback():
    model = make_random("qwen3_moe", Path(tempfile.mkdtemp(prefix="cli-fleet-")), seed=0)
    write_tokenizer(model)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k != LOCAL_ONLY_ENV}
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    out = tempfile.NamedTemporaryFile(prefix="cli-fleet-", suffix=".log", delete=False)  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "execstate", "serve", str(model), "--ray", "--replicas", "3",
                             "--port", str(port), "--served-model-name", "m"],
                            stdout=out, stderr=subprocess.STDOUT, env=env)

    def log() -> str:
        return Path(out.name).read_text(errors="replace")

    def replicas() -> list[dict]:
        try:
            return httpx.get(url + "/v1/fleet/replicas", timeout=5).json()["replicas"]
        except (httpx.HTTPError, ValueError, KeyError):
            return []

    def wait(pred, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while not (got := pred()):
            assert proc.poll() is None, f"the CLI exited ({proc.returncode}) waiting for {what}:\n{log()[-3000:]}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{log()[-3000:]}"
            time.sleep(0.5)
        return got

    try:
        first = wait(replicas, 600, "the first replica to register")
        killed_before_ready = READY not in log()
        os.kill(first[0]["pid"], signal.SIGKILL)  # a replica dies while the fleet deploys
        wait(lambda: READY in log(), 900, "the ready line")
        assert "0.66 CPU each" in log() or os.cpu_count() != 2, log()[-2000:]
        r = wait(lambda: _complete(url), 300, "an answer from the fleet")
        assert r["choices"][0]["text"] is not None
        regs = wait(lambda: len(rs := [x for x in replicas() if x["pid"] != first[0]["pid"]]) >= 3 and rs, 600,
                    "three live replicas")
        assert len({x["replica_id"] for x in regs}) >= 3
        addresses = listening_addresses(descendants(proc.pid))
        assert addresses and all(loopback(a) for a in addresses), addresses
        assert proc.poll() is None
        print(f"killed while deploying: {killed_before_ready}; listening on {sorted(addresses)}")
    finally:
        started = descendants(proc.pid) - {proc.pid}
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # the CLI shuts Serve and its Ray cluster down
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
        for pid in started:  # what the cluster left behind, if anything: only the processes this test started
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        os.unlink(out.name)


def _complete(url: str) -> dict | None:
    try:
        r = httpx.post(url + "/v1/completions", json={"model": "m", "prompt": [5, 6, 7], "max_tokens": 3,
                                                       "temperature": 0}, timeout=60)
    except httpx.HTTPError:
        return None
    return r.json() if r.status_code == 200 else None

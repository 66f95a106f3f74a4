"""The PD bench's processes: ``execstate serve`` / ``execstate proxy`` subprocesses on
127.0.0.1, their health, CPU use and shutdown.

Threads: every engine process gets ``OMP_NUM_THREADS = MKL_NUM_THREADS = threads`` (default:
all CPUs). Requests are sequential, so only one engine computes at a time (P while D waits,
then D) and each may use every core. The proxies and this client get one thread (they only
move bytes). Idle engines without a connector block on their queue; an engine with a NIXL
agent does not: NIXL's UCX progress thread polls without sleeping (``pthrDelay=0`` in the
``nixl`` Python API), about one core per PD process. The servers stay in this process's
session, so under the kernel's autogroup scheduling the whole bench is one group (it does
not take one share of a shared machine per server) and thread nice values apply across
the servers. The bench measures that
(``idle_profile``: cores per idle process, busy thread ids) and, with
``nice_busy_threads=True`` (``--nice-nixl-threads``), renices those threads to 19 so they
only take CPU that compute threads leave: a diagnostic, off by default.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SERVED_NAME = "m"
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listens_on(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds a TCP socket listening on ``port`` (Linux /proc): the check
    that a ``/health`` answer on that port came from the process started for it, not from another
    one that took the port first (the started one then fails to bind and exits, too late for a
    health check already answered)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                f = line.split()
                if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                    inodes.add(f"socket:[{f[9]}]")
    if not inodes:
        return False
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
    return False


def kv_config(role: str, policy: str = "fail", timeout_s: float = 10.0, ttl_s: float | None = None) -> str:
    """``--kv-transfer-config`` JSON of a PD instance (NIXL, route transfer on). The handoff secret
    reaches every process through ``$EXECSTATE_KV_SECRET`` (``Cluster.secret``)."""
    extra: dict[str, Any] = {"transfer_timeout_s": timeout_s}
    if ttl_s is not None:
        extra["transfer_ttl_s"] = ttl_s
    return json.dumps({"kv_connector": "NixlConnector", "kv_role": role, "enable_routed_experts_transfer": True,
                       "kv_load_failure_policy": policy, "kv_connector_extra_config": extra})


def _stat_cpu_seconds(stat: Path) -> float:
    """user + system CPU seconds from a /proc ``stat`` file (raises OSError, IndexError, ValueError)."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread id of a process (/proc)."""
    out: dict[str, float] = {}
    with contextlib.suppress(OSError):
        for t in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, IndexError, ValueError):
                out[t] = _stat_cpu_seconds(Path(f"/proc/{pid}/task/{t}/stat"))
    return out


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    url: str
    log: Path
    port: int = 0

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def cpu_seconds(self) -> float:
        """user + system CPU seconds of the process (its threads included), from /proc; NaN if unreadable."""
        try:
            return _stat_cpu_seconds(Path(f"/proc/{self.popen.pid}/stat"))
        except (OSError, IndexError, ValueError):
            return float("nan")


@dataclass
class Cluster:
    """The bench's subprocesses; ``close`` stops every one of them (SIGINT, then SIGKILL)."""

    threads: int
    logdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="execstate-bench-pd-")))
    procs: dict[str, Proc] = field(default_factory=dict)
    secret: str = field(default_factory=lambda: secrets.token_hex(16))  # P, D and proxies share it

    def spawn(self, name: str, args: list[str], threads: int, fault: str | None = None) -> str:
        """Start ``execstate ARGS --port P``; with ``fault`` (a fault mode) through the fault launcher.
        ``P``: a free port none of this cluster's processes was given (the OS can hand out a port
        again right after ``free_port`` closed it)."""
        taken = {p.port for p in self.procs.values()}
        port = free_port()
        while port in taken:
            port = free_port()
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
                   PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p),
                   EXECSTATE_KV_SECRET=self.secret)
        log = self.logdir / f"{name}.log"
        launcher = ["execstate"] if fault is None else ["execstate_bench.faulty_serve", json.dumps({"mode": fault})]
        with open(log, "wb") as fh:  # a file, not a pipe: a full pipe would block the server
            popen = subprocess.Popen([sys.executable, "-m", *launcher, *args, "--port", str(port)],
                                     env=env, stdout=fh, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        self.procs[name] = Proc(name, popen, url, log, port)
        return url

    def serve(self, name: str, model: Path, kv: str | None = None, fault: str | None = None) -> str:
        args = ["serve", str(model), "--served-model-name", SERVED_NAME, "--enable-return-routed-experts"]
        return self.spawn(name, args + (["--kv-transfer-config", kv] if kv else []), self.threads, fault)

    def proxy(self, name: str, prefill: str, decode: str) -> str:
        return self.spawn(name, ["proxy", "--prefill", prefill, "--decode", decode], 1)

    def wait_healthy(self, client: Any, names: list[str] | None = None, timeout_s: float = 300.0) -> float:
        """Wait until the processes (default: all) answer ``/health`` with 200 on their port, and
        listen on it themselves (``listens_on``: another process answering there does not count);
        returns the seconds waited."""
        import httpx

        t0 = time.monotonic()
        pending = {n: self.procs[n] for n in (names or self.procs)}
        while pending:
            for name, p in list(pending.items()):
                if p.popen.poll() is not None:
                    raise RuntimeError(f"{name} exited with {p.popen.returncode}:\n{p.log_tail()}")
                try:
                    if client.get(p.url + "/health", timeout=2.0).status_code == 200 and \
                            listens_on(p.popen.pid, p.port):
                        del pending[name]
                except httpx.HTTPError:
                    pass
            if pending and time.monotonic() - t0 > timeout_s:
                raise RuntimeError(f"not healthy after {timeout_s:.0f} s: {sorted(pending)}")
            time.sleep(0.25)
        return time.monotonic() - t0

    def close(self) -> None:
        for p in self.procs.values():
            if p.popen.poll() is None:
                p.popen.send_signal(signal.SIGINT)
        for p in self.procs.values():
            try:
                p.popen.wait(15)
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait(5)
        shutil.rmtree(self.logdir, ignore_errors=True)

    def idle_profile(self, names: list[str], window_s: float = 2.0) -> dict[str, Any]:
        """CPU cores each (idle) process uses over ``window_s``, and its threads using >= 0.1 core."""
        before = {n: _thread_cpu(self.procs[n].popen.pid) for n in names}
        time.sleep(window_s)
        out: dict[str, Any] = {}
        for n in names:
            after = _thread_cpu(self.procs[n].popen.pid)
            per = {t: (v - before[n].get(t, 0.0)) / window_s for t, v in after.items()}
            out[n] = {"cores": round(sum(per.values()), 3),
                      "busy_threads": {t: round(c, 3) for t, c in per.items() if c >= 0.1}}
        return out

    def nice_busy_threads(self, profile: dict[str, Any]) -> dict[str, list[int]]:
        """Renice (19) the threads that were busy while their process was idle: NIXL's UCX
        progress thread polls without sleeping (``pthrDelay=0``); at nice 19 it only gets the
        CPU that compute threads leave. Never the main thread."""
        done: dict[str, list[int]] = {}
        for n, prof in profile.items():
            pid = self.procs[n].popen.pid
            for t in prof["busy_threads"]:
                if int(t) != pid:
                    with contextlib.suppress(OSError):
                        os.setpriority(os.PRIO_PROCESS, int(t), 19)
                        done.setdefault(n, []).append(int(t))
        return done
